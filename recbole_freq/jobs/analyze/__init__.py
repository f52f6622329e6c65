"""``--analyze``: what a trained model does to the frequencies of its sequences
(``measures``) and the figures drawn from them (``figures``)."""
