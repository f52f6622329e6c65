#!/usr/bin/env bash
# Before a lease, on this machine: what a lent GPU machine needs beside the working tree,
# in the two ignored folders its call carries (carry: [".whl", ".lease-data"]).
#   benchmarks/lease_pack.sh START [DATASET...]     (default datasets: amazon-beauty lastfm)
# START: the commit this session started from, whose .git the lent machine is sent.
# - .whl/: RecBole 1.2.1 and what the machine's image lacks (its Python is 3.12; pandas
#   2.x because setup.cfg pins pandas < 3), at the versions of this checkout's .venv;
# - .lease-data/raw/: the shared one-line files of the DATASETs (prepared there by
#   benchmarks/lease_device.sh: a third of their prepared size travels);
# - .lease-data/code.bundle: the commits since START (lease.py code_bundle), so the runs
#   there record the commit they run;
# then lease.py prepare holds back resume states until the tree and both folders fit in
# the 64 MiB a call sends. On the machine: bash benchmarks/lease_device.sh MINUTES $OUT.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
[ $# -ge 1 ] || { echo "usage: benchmarks/lease_pack.sh START [DATASET...]" >&2; exit 2; }
start=$1
shift
datasets=("$@")
[ ${#datasets[@]} -gt 0 ] || datasets=(amazon-beauty lastfm)
python=$root/.venv/bin/python
shared=${SHARED_DATA:-$root/../shared/data/s3rec}

raw_file() {
  case "$1" in
    amazon-beauty) echo Beauty.txt ;;
    lastfm) echo LastFM.txt ;;
    amazon-sports-outdoors) echo Sports_and_Outdoors.txt ;;
    amazon-toys-games) echo Toys_and_Games.txt ;;
    yelp) echo Yelp.txt ;;
    *) echo "lease_pack: no shared one-line file for dataset '$1'" >&2; return 2 ;;
  esac
}

grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
rm -rf .whl .lease-data/raw .lease-data/code.bundle
mkdir -p .whl .lease-data/raw
version() { "$python" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pure=(recbole==1.2.1 "colorlog==$(version colorlog)" "texttable==$(version texttable)"
      "thop==$(version thop | sed 's/-/.post/')" pytz tzdata)
"$python" -m pip download -q --no-deps --only-binary=:all: -d .whl "${pure[@]}"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "pandas==$(version pandas)"

for name in "${datasets[@]}"; do
  file=$(raw_file "$name")
  cp "$shared/$file" ".lease-data/raw/$name.txt"
done
"$python" benchmarks/lease.py code_bundle --since "$start" --to .lease-data/code.bundle

carried=$(du -sb .whl .lease-data | awk '{s += $1} END {print s}')
# prepare keeps 8 MiB for the data; here the carried folders' own size is known.
tree_mib=$("$python" -c "print(64 - $carried / 2**20 + 8 - 1)")
"$python" benchmarks/lease.py prepare --tree_mib "$tree_mib"
echo "lease_pack: carry .whl and .lease-data ($((carried / 1048576)) MiB); datasets: ${datasets[*]}"
