#!/usr/bin/env bash
# `make bench`: the policy evaluator, the decision engine and the HTTP server benchmarks, in that
# order, printing every number. Installs wrk (Debian package) when it is missing and apt-get can.
# Extra arguments go to bench/bench_http.py (e.g. `bash hack/bench.sh --quick`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

if ! command -v wrk >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "== installing wrk (apt-get)"
    apt-get update -qq >/dev/null && apt-get install -y -qq wrk >/dev/null
  else
    echo "bench: wrk is not installed and apt-get is not usable here; the HTTP benchmark will be skipped" >&2
  fi
fi

run() {  # run <title> <script> [args...]: skip with a message when another engineer's script is absent
  local title=$1 script=$2
  shift 2
  echo
  echo "== ${title} (${script})"
  if [ -f "${script}" ]; then
    "${PY}" "${script}" "$@"
  else
    echo "   ${script} is not there yet: skipped"
  fi
}

run "policy evaluation" bench/bench_policy.py
run "placement decision" bench/bench_engine.py
run "TrainJob composition" bench/bench_trainjob.py
run "a burst of admissions with the reservation ledger" bench/bench_burst.py
run "HTTP: topoguard serve under wrk" bench/bench_http.py "$@"
run "adversarial reviews: worst-case time and memory" bench/bench_adversarial.py
audit_size=--full
case " $* " in *" --quick "*) audit_size=--quick ;; esac
run "audit: one pass over the running training jobs" bench/bench_audit.py "${audit_size}"
# The what-if of one policy change at 5,000 nodes / 3,000 jobs / 1,000 policies (a tenth with --quick).
whatif_size=()
case " $* " in *" --quick "*) whatif_size=(--quick) ;; esac
run "what-if: one policy change judged against the running jobs" bench/bench_whatif.py "${whatif_size[@]}"
# The scale bench: a tenth of the 5,000-node, 150,000-pod cluster by default (minutes); TOPOGUARD_BENCH_SCALE=full
# runs the whole size (about ten minutes, 2 GB in the list/watch server).
scale_size=()
[[ "${TOPOGUARD_BENCH_SCALE:-}" == full ]] && scale_size=(--full)
run "scale: the watch cache of a large cluster under pod churn" bench/bench_scale.py "${scale_size[@]}"
# The same cluster with its GPUs from DRA: 5,000 of 7,500 nodes publishing 8 GPUs each as ResourceSlices, 20,000
# allocated claims, claims recreated with their pods (a tenth by default; the file phase is the one above's).
run "scale, GPUs from DRA: ResourceSlices and allocated claims under pod and claim churn" bench/bench_scale.py \
  --dra --no-file "${scale_size[@]}"
