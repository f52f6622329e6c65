"""Generic pieces every layer may use: option checks, atomic files, signals, the command
line's names and defaults, and the property files.  They import nothing of the plugin
above them."""
