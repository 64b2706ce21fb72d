#!/usr/bin/env bash
# FlashAttention 4: installed from two carried halves, its GPU tests, the attention A/B with fa4 in it.
# Issue 7. Its wheels are 102 MB (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1 + libs-base/-core/-cu13,
# apache-tvm-ffi, torch-c-dlpack-ext, quack-kernels, einops), more than one call may carry, so they travel
# as one tar split in two folders (not in git; rebuild them with the recipe in benchmarks/NOTES.md,
# "Device runs") and meet under /root, which survives between calls while the machine is warm:
#     bash benchmarks/device.sh fa4-1   # STEP=1, carry .whl_fa4a: parks part aa in /root
#     bash benchmarks/device.sh fa4-2   # STEP=2, carry .whl_fa4b only (64 MiB a call): joins, installs, GPU
#                                       # tests of the fa4 backend, then the A/B; FlashInfer joins the
#                                       # A/B when an earlier call with .whl_fi left it in /root/fi
# The DSL needs its .pth processed, so the install dir is added with site.addsitedir() by a sitecustomize.py
# on PYTHONPATH. Output (the A/B json, the log) lands in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh" || exit 1
export ROSE_KERNEL_CACHE_DIR=/root/rose-kernels
case "${STEP:-1}" in
1)
  cp .whl_fa4a/fa4.tar.part-aa /root/ && ls -la /root/fa4.tar.part-aa
  ;;
2)
  if [ ! -d /root/fa4 ]; then
    cat /root/fa4.tar.part-aa .whl_fa4b/fa4.tar.part-ab > /root/fa4.tar || exit 1
    (cd /root && sha256sum fa4.tar) | diff - <(sed 's#/tmp/fa4.tar#fa4.tar#' .whl_fa4b/fa4.tar.sha256) \
      || { echo "fa4.tar does not match its checksum"; exit 1; }
    tar xf /root/fa4.tar -C /root && python3 -m pip install -q --no-index --no-deps --no-compile \
      --target /root/fa4 /root/fa4w/*.whl || exit 1
  fi
  install_flashinfer
  mkdir -p /root/sitecustom
  printf 'import site\nfor d in ("/root/fa4", "/root/fi"):\n    site.addsitedir(d)\n' > /root/sitecustom/sitecustomize.py
  export PYTHONPATH=/root/sitecustom:$PWD
  python3 -c "import flash_attn.cute as f, torch; print('flash_attn.cute ok |', torch.__version__, '|', torch.cuda.get_device_name())" \
    2>&1 | tail -2
  echo "== GPU tests of the fa4 backend"
  ROSE_TEST_SLOW_JIT=1 timeout 240 python3 -m pytest -q -m gpu tests/rose/test_rose_attention_backends.py -k fa4 \
    -p no:cacheprovider > "$OUT/fa4_tests.log" 2>&1; tail -5 "$OUT/fa4_tests.log"
  echo "== A/B with fa4 (JIT build timed first)"
  backends=varlen,fa4
  python3 -c "import flashinfer" 2>/dev/null && backends=varlen,flashinfer-fa2,flashinfer-fa3,fa4
  timeout 300 python3 -m benchmarks.attention_ab --build-kernels --backends $backends \
    --models qwen3-0.6b,qwen3-4b,minilm-l6 --out "$OUT" --tag _fa4 --profile-dir /root/profiles-fa4 \
    > "$OUT/attention_fa4.log" 2>&1
  grep "^==\|^  build\|profile ->\|rror" "$OUT/attention_fa4.log" | cut -c1-160
  [ -f "$OUT/attention_backends_fa4.json" ] \
    && python3 -m benchmarks.attention_ab --print-table "$OUT/attention_backends_fa4.json" | tail -24
  ;;
esac
