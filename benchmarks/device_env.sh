# The common environment of a device run, sourced by benchmarks/device.sh and by every benchmarks/*_device.sh
# (so each script also runs alone): the repository root as the working directory, unbuffered Python, $OUT
# (the folder whose files come back), GIT_COMMIT, the carried wheels of .whl installed into /tmp/site when
# .whl is there, and PYTHONPATH=/tmp/site:$PWD. The install runs once per call (DEVICE_ENV_READY).
# Helpers for the scripts: zoo_folder, require_carried DIR, install_flashinfer, use_flashinfer, engine_ab.

cd "$(dirname "${BASH_SOURCE[0]}")/.." || return 1
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT" || return 1
export GIT_COMMIT=${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}
if [ -z "${DEVICE_ENV_READY:-}" ]; then
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || return 1
  fi
  export PYTHONPATH=/tmp/site:$PWD DEVICE_ENV_READY=1
fi

# zoo_folder NAME DIR: the benchmark zoo's NAME (random bf16, benchmarks.model_zoo) at DIR unless it is there
# already (a warm machine keeps /tmp); fails naming DIR when it could not be written.
zoo_folder() {
  if [ ! -f "$2/config.json" ]; then
    python3 -m benchmarks.model_zoo "$1" "$2" --dtype bfloat16 2>&1 | grep -v Writing | tail -1
  fi
  [ -f "$2/config.json" ] || { echo "no model folder at $2" >&2; return 1; }
}

# require_carried DIR: stop unless DIR/*.whl came with this call (the run's `carry` must name DIR).
require_carried() {
  ls "$1"/*.whl > /dev/null 2>&1 || { echo "no $1/*.whl in this tree: carry $1" >&2; exit 1; }
}

# install_flashinfer: FlashInfer's wheels from .whl_fi into /root/fi, once per warm machine (/root survives
# between calls while the machine stays warm; the carried tree does not).
install_flashinfer() {
  if [ ! -d /root/fi/flashinfer ] && ls .whl_fi/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /root/fi .whl_fi/*.whl
  fi
  return 0
}

# use_flashinfer: install_flashinfer, /root/fi first on PYTHONPATH, and the JIT kernel cache under /root
# unless ROSE_KERNEL_CACHE_DIR is set already.
use_flashinfer() {
  install_flashinfer
  if [ -d /root/fi ]; then
    case ":${PYTHONPATH:-}:" in *:/root/fi:*) ;; *) export PYTHONPATH=/root/fi${PYTHONPATH:+:$PYTHONPATH} ;; esac
  fi
  export ROSE_KERNEL_CACHE_DIR=${ROSE_KERNEL_CACHE_DIR:-/root/rose-kernels}
}

# engine_ab TAG VAR "VALUE ..." SUITES: benchmarks.rose_gpu's rose-graphs rows of AB_MODELS (qwen3-0.6b; a comma
# list: qwen3-0.6b,qwen3-4b) at SUITES once per VALUE
# of the environment variable VAR (each run a process of its own, AB_TIMEOUT s at most: 120), alternating ROUNDS
# times (2); each run's rose_gpu_TAG_VALUE_ROUND.json and .log appended to $OUT/rose_gpu_TAG.tar as it ends (a
# call returns 8 files of $OUT at most; a killed call keeps the runs before), its rows printed.
engine_ab() {
  local tag=$1 var=$2 values=$3 suites=$4 round value name
  for round in $(seq "${ROUNDS:-2}"); do
    for value in $values; do
      name=_${tag}_${value}_$round
      env "$var=$value" timeout "${AB_TIMEOUT:-120}" python3 -m benchmarks.rose_gpu --models "${AB_MODELS:-qwen3-0.6b}" \
        --variants rose-graphs --suites "$suites" --quick --tag "$name" --out "$OUT" > "$OUT/rose_gpu$name.log" 2>&1
      echo "round $round $var=$value rc=$? (${SECONDS} s into the script)"
      grep -E '^ *[a-z0-9.-]+ +(bs1|score|docs)[^ ]* +rose-graphs +[0-9]' "$OUT/rose_gpu$name.log" | tail -8
      tar rf "$OUT/rose_gpu_$tag.tar" -C "$OUT" --remove-files "rose_gpu$name.log" $(cd "$OUT" && ls "rose_gpu$name.json" 2>/dev/null)
    done
  done
}
