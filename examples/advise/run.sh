#!/bin/sh
# The advice shipped in README (section "Which technique first (advise)"): llama2-7b on two
# 4-GPU RTX 4090 workstations and on 16 L40S, each as the GPU preset models its node, and the
# L40S as 4 nodes of 4 (the preset's 50 Gb/s per GPU kept). Run from the repository root:
#   sh examples/advise/run.sh        (writes examples/advise/*.txt, *.csv and docs/img/advise-*.png)
set -e
VF=${VF:-.venv/bin/vtrain-fast}
export COLUMNS=160
out=examples/advise
$VF advise --model llama2-7b --gpus rtx4090-pcie-24gb:8 --budget-usd 10000 \
    --overwrite -o $out/llama2-7b-8x-rtx4090.csv --plot docs/img/advise-llama2-7b-8x-rtx4090.png > $out/llama2-7b-8x-rtx4090.txt
$VF advise --model llama2-7b --gpus l40s-pcie-48gb:16 --days 30 \
    --overwrite -o $out/llama2-7b-16x-l40s.csv --plot docs/img/advise-llama2-7b-16x-l40s.png > $out/llama2-7b-16x-l40s.txt
$VF advise --model llama2-7b --gpus l40s-pcie-48gb:16 --days 30 --set gpus_per_node=4 \
    --overwrite -o $out/llama2-7b-4x4-l40s.csv > $out/llama2-7b-4x4-l40s.txt
