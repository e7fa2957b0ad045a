#!/usr/bin/env bash
# Device check for a CUDA machine that already has torch installed (any
# supported version, e.g. 2.11; this script never installs torch).
#
#   bash scripts/device_check.sh            # from anywhere; runs in the repo root
#   PYTHON=/path/to/python bash scripts/device_check.sh
#
# Steps, each under its own `timeout` (at most 480 s in all):
#   1. environment  (GPU, torch, nvcc)
#   2. build        TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 pip install --no-build-isolation --no-deps -e .
#   3. smoke        carbon.mm on a CUDA tensor (are the CUDA kernels built?)
#   4. tests        python -m pytest -v tests -m cuda [-n 8 with pytest-xdist] > tests_full.log (each result as it
#                   finishes, so a cut-off run still names its failures); exit 5 = no tests collected: OK, reported
#                   On a machine without a GPU these are all skipped.
#   5. benchmark    python benchmarks/bench_mm.py --device cuda
#                   python benchmarks/bench_reduce.py --device cuda
#                   python benchmarks/bench_cumsum.py --device cuda --budget 0.3
#                   python benchmarks/bench_norm.py --device cuda --budget 0.3
#                   python benchmarks/bench_elementwise.py --device cuda
#                   python benchmarks/bench_elementwise.py --device cuda --float64 --quick
#                   python benchmarks/bench_softmax.py --device cuda
#                   python benchmarks/bench_attention.py --device cuda --quick
#                   python benchmarks/bench_scatter.py --device cuda --budget 0.3
#                   python benchmarks/bench_random.py --device cuda --quick --budget 0.2
#                   python benchmarks/bench_optim.py --device cuda --budget 0.5
#                   python benchmarks/bench_enable.py --device cuda --budget 1 --modes carbon.enable
#                                                    (GPT-2 small step, carbon.enable vs plain fp32)
#                   python benchmarks/bench_conv.py --device cuda --budget 0.2
#   6. demo         python -m carbon demo --steps 8 --batch-size 8 --no-progress  (a short run; its golden check
#                   compares the CUDA fingerprint with tests/demo_golden.txt, recorded on the CPU)
# A failing step is recorded and the next one still runs; the summary table is
# printed last, and the exit status is non-zero if any step failed.
# Logs go to $LOGDIR (default: $OUT/device_check if $OUT is set, else a temp dir).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if [[ -n "${LOGDIR:-}" ]]; then :
elif [[ -n "${OUT:-}" ]]; then LOGDIR="$OUT/device_check"
else LOGDIR="$(mktemp -d -t carbon_device_check.XXXXXX)"
fi
mkdir -p "$LOGDIR"

# Per-step limits in seconds; they sum to 480 s, so the whole check ends within
# 8 minutes even if every step times out. Override through the environment.
# The build has the most room: a build cut off loses every later step, a
# benchmark cut off only its own table. (On this project's 2-core VM the
# longest single file, csrc/elementwise/elementwise.cpp, takes ~100 s; the
# ~15 .cu files take ~70 s each, 16 at a time there.)
T_ENV="${T_ENV:-10}"
T_BUILD="${T_BUILD:-186}"
T_SMOKE="${T_SMOKE:-15}"
T_TESTS="${T_TESTS:-90}"
T_BENCH="${T_BENCH:-20}"
T_REDUCE="${T_REDUCE:-12}"
T_CUMSUM="${T_CUMSUM:-6}"
T_NORM="${T_NORM:-12}"
T_ELEM="${T_ELEM:-12}"
T_ELEM64="${T_ELEM64:-8}"
T_SOFTMAX="${T_SOFTMAX:-15}"
T_ATTN="${T_ATTN:-15}"
T_SCATTER="${T_SCATTER:-12}"
T_RANDOM="${T_RANDOM:-12}"
T_OPTIM="${T_OPTIM:-15}"
T_ENABLE="${T_ENABLE:-12}"
T_CONV="${T_CONV:-8}"
T_DEMO="${T_DEMO:-20}"

declare -a STEP_NAMES=() STEP_STATUS=() STEP_SECS=()
FAILED=0

# run_step NAME LIMIT_S CMD...: run CMD with a time limit, tee its output to
# $LOGDIR/NAME.log, record status and duration. Sets STEP_RC.
run_step() {
  local name="$1" limit="$2"
  shift 2
  local shown="$*"
  shown="${shown//$'\n'/ }"
  echo
  echo "=== [$name] ${shown:0:160} (limit ${limit}s) ==="
  local start end rc=0
  start=$(date +%s)
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$LOGDIR/$name.log" || rc=$?
  end=$(date +%s)
  STEP_RC=$rc
  local status
  case "$rc" in
    0) status="ok" ;;
    124 | 137) status="TIMEOUT after ${limit}s" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  STEP_NAMES+=("$name")
  STEP_STATUS+=("$status")
  STEP_SECS+=("$((end - start))")
  echo "=== [$name] $status in $((end - start)) s ==="
}

# Mark the last recorded step failed unless $1 (its exit code) is acceptable.
record() {
  local rc="$1" ok_note="${2:-}"
  if [[ "$rc" -ne 0 ]]; then
    FAILED=1
  elif [[ -n "$ok_note" ]]; then
    STEP_STATUS[-1]="ok ($ok_note)"
  fi
}

# ---- 1. environment ------------------------------------------------------
run_step env "$T_ENV" bash -c '
  set -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi: not available"
  echo "nvcc: $(command -v nvcc || echo "not on PATH")"; [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version | tail -n 2
  "$0" -c "import sys, torch; print(\"python\", sys.version.split()[0]); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else \"\")"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo uncommitted)"
' "$PY"
record "$STEP_RC"

# ---- 2. build --------------------------------------------------------------
run_step build "$T_BUILD" env TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 \
  "$PY" -m pip install --no-build-isolation --no-deps -e .
record "$STEP_RC"
BUILD_SECS="${STEP_SECS[-1]}"

# ---- 3. smoke: are the CUDA kernels there and exact? -------------------------
run_step smoke "$T_SMOKE" "$PY" -c '
import torch, carbon
a = torch.randn(64, 300, device="cuda"); b = torch.randn(300, 32, device="cuda")
g = carbon.mm(a, b); c = carbon.mm(a.cpu(), b.cpu())
same = torch.equal(g.cpu().view(torch.int32), c.view(torch.int32))
print("carbon", carbon.__file__, "| carbon.mm on cuda:", tuple(g.shape), g.dtype, "| CPU == GPU bits:", same)
raise SystemExit(0 if same else 1)
'
record "$STEP_RC"

# ---- 4. tests ----------------------------------------------------------------
if [[ -d tests ]]; then
  # pytest-xdist (in the H200 image) runs the CUDA tests in 8 processes: the
  # tests' CPU references and oracles (most of their time) use 8 of the 16
  # cores, and a kernel fault that poisons one process's CUDA context does not
  # fail the tests of the others.
  XDIST=()
  if "$PY" -c "import xdist" 2>/dev/null; then XDIST=(-n 8); fi
  # Every test's result goes to tests_full.log as it finishes (-v, unbuffered),
  # so a run cut off by the time limit still says which tests passed and
  # failed; the console (tests.log) gets the failures and pytest's last line.
  run_step tests "$T_TESTS" env PYTHONUNBUFFERED=1 bash -c '
    log="$1"; shift
    "$0" -m pytest tests -m cuda -p no:cacheprovider -v -rfE --tb=short --durations=5 "$@" > "$log" 2>&1
    rc=$?
    grep -E "^(FAILED|ERROR) |^=+ .* in [0-9.]+s|slowest|^[0-9.]+s (call|setup)" "$log" | tail -n 60
    exit $rc
  ' "$PY" "$LOGDIR/tests_full.log" "${XDIST[@]}"
  if [[ "$STEP_RC" -eq 5 ]]; then
    echo "(pytest exit 5 = no tests collected; counted as OK)"
    record 0 "no tests collected: pytest exit 5"
  else
    record "$STEP_RC"
  fi
else
  STEP_NAMES+=("tests"); STEP_STATUS+=("skipped: no tests/ directory"); STEP_SECS+=("0")
fi
# pytest's final line, e.g. "300 passed, 6 skipped, 818 deselected in 41.2s";
# after a timeout, the results logged so far.
TEST_COUNTS="$(grep -E ' in [0-9.]+s' "$LOGDIR/tests.log" 2>/dev/null | tail -n 1 | tr -d '=' | sed 's/^ *//; s/ *$//' || true)"
if [[ -z "$TEST_COUNTS" && -f "$LOGDIR/tests_full.log" ]]; then
  # (grep -c exits 1 on a count of 0, which set -e would take for a failure)
  TEST_COUNTS="cut off: $(grep -c ' PASSED' "$LOGDIR/tests_full.log" || true) passed, $(grep -c ' FAILED' "$LOGDIR/tests_full.log" || true) failed, $(grep -c ' ERROR' "$LOGDIR/tests_full.log" || true) errors so far"
fi
TEST_FAILURES="$(grep -hoE '(FAILED|ERROR) tests/[^ ]+' "$LOGDIR/tests_full.log" 2>/dev/null | sort -u | head -n 40 || true)"

# ---- 5. benchmark ------------------------------------------------------------
run_step bench "$T_BENCH" "$PY" benchmarks/bench_mm.py --device cuda
record "$STEP_RC"
run_step reduce "$T_REDUCE" "$PY" benchmarks/bench_reduce.py --device cuda
record "$STEP_RC"
run_step cumsum "$T_CUMSUM" "$PY" benchmarks/bench_cumsum.py --device cuda --budget 0.3
record "$STEP_RC"
run_step norm "$T_NORM" "$PY" benchmarks/bench_norm.py --device cuda --budget 0.3
record "$STEP_RC"
run_step elem "$T_ELEM" "$PY" benchmarks/bench_elementwise.py --device cuda
record "$STEP_RC"
run_step elem64 "$T_ELEM64" "$PY" benchmarks/bench_elementwise.py --device cuda --float64 --quick
record "$STEP_RC"
run_step softmax "$T_SOFTMAX" "$PY" benchmarks/bench_softmax.py --device cuda
record "$STEP_RC"
run_step attn "$T_ATTN" "$PY" benchmarks/bench_attention.py --device cuda --quick
record "$STEP_RC"
run_step scatter "$T_SCATTER" "$PY" benchmarks/bench_scatter.py --device cuda --budget 0.3
record "$STEP_RC"
run_step random "$T_RANDOM" "$PY" benchmarks/bench_random.py --device cuda --quick --budget 0.2
record "$STEP_RC"
run_step optim "$T_OPTIM" "$PY" benchmarks/bench_optim.py --device cuda --budget 0.5
record "$STEP_RC"
# --budget is a soft budget for the timed rounds (every mode once per round) after a warm-up and a probe
# round, with at least 3 timed rounds however long they take: 5 steps per mode at least. Estimated
# conservatively on the H200 (plain fp32 step ~0.15 s, carbon's up to 3x: ~0.6 s a round of the two), the 5
# rounds take ~3 s, plus ~5-6 s of start (imports, CUDA context, model, first-call set-up). With tf32 and
# bf16 autocast as well (~0.9 s a round) and --budget 4 (6 rounds) it would be ~11 s of the 12.
run_step enable "$T_ENABLE" "$PY" benchmarks/bench_enable.py --device cuda --budget 1 --modes carbon.enable
record "$STEP_RC"
run_step conv "$T_CONV" "$PY" benchmarks/bench_conv.py --device cuda --budget 0.2
record "$STEP_RC"

# ---- 6. demo -----------------------------------------------------------------
run_step demo "$T_DEMO" "$PY" -m carbon demo --steps 8 --batch-size 8 --no-progress --plot "$LOGDIR/carbon_demo_loss.png"
record "$STEP_RC"

# ---- summary (last) ----------------------------------------------------------
echo
echo "================ device check summary ================"
printf '| %-6s | %-44s | %7s |\n' "step" "status" "seconds"
printf '|%s|%s|%s|\n' "--------" "----------------------------------------------" "---------"
for i in "${!STEP_NAMES[@]}"; do
  printf '| %-6s | %-44s | %7s |\n' "${STEP_NAMES[$i]}" "${STEP_STATUS[$i]}" "${STEP_SECS[$i]}"
done
echo
echo "build: ${BUILD_SECS} s"
echo "tests (-m cuda): ${TEST_COUNTS:-none collected or no counts (see $LOGDIR/tests.log)}"
if [[ -n "$TEST_FAILURES" ]]; then
  echo "failing tests (first 40; tracebacks in $LOGDIR/tests_full.log):"
  echo "$TEST_FAILURES" | sed 's/^/  /'
fi
echo "benchmark ratios:"
grep -hE '^RATIO' "$LOGDIR"/*.log 2>/dev/null | sed 's/^/  /' || echo "  (none: see the benchmark logs in $LOGDIR)"
echo "demo (carbon rows):"
grep -E '^\| (cpu|cuda) +\| carbon|^golden' "$LOGDIR/demo.log" 2>/dev/null | sed 's/^/  /' || echo "  (none: see $LOGDIR/demo.log)"
echo "logs: $LOGDIR"
if [[ "$FAILED" -ne 0 ]]; then
  echo "RESULT: FAILED (at least one step failed; see above)"
  exit 1
fi
echo "RESULT: OK"
