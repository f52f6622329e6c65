# Sourced by the reproduce_*.sh scripts that run several --compare processes side by
# side:  source side_by_side.sh SCRIPT_NAME DATA_PATH OUT_DIR [SECONDS]
# sets root, data, out, seconds and python, one torch thread per process, and defines
#   launch FOLDER ARGS...  one --compare of OUT_DIR/FOLDER in the background (stopped
#                          after SECONDS if given); its log is appended to
#                          FOLDER/compare.log, so a resumed run keeps the earlier part;
#                          every folder shares one checkpoint_dir, OUT_DIR/saved;
#   wait_and_report        wait for every launch and print each log's last lines.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage="usage: $1 DATA_PATH OUT_DIR [SECONDS]"
data=${2:?$usage}
out=${3:?$usage}
seconds=${4:-0}
python=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1

launch() {
  local folder=$1
  shift
  mkdir -p "$out/$folder"
  local limit=()
  [ "$seconds" != 0 ] && limit=(timeout -s TERM "$seconds")
  "${limit[@]}" "$python" "$root/run_recbole_freq.py" --compare "$@" --out "$out/$folder" \
    --data_path="$data" --checkpoint_dir="$out/saved" --show_progress=False \
    >>"$out/$folder/compare.log" 2>&1 &
}

wait_and_report() {
  wait
  for log in "$out"/*/compare.log; do
    echo "== $log"
    tail -n 3 "$log"
  done
}
