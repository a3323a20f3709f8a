#!/usr/bin/env bash
# A pinned recipe for training with EasyR1 on a GPU machine, in three steps (docs/easyr1.md,
# "A pinned recipe"):
#
#   scripts/easyr1_recipe.sh setup                      # a venv with the pinned GPU stack + EasyR1 + this project
#   scripts/easyr1_recipe.sh vidoseek                   # download ViDoSeek (questions + PDFs) into $DATA/source
#   scripts/easyr1_recipe.sh data QA_JSON DOCS_DIR      # index the documents, convert a train and a val split
#   scripts/easyr1_recipe.sh train [CONFIG] [key=value ...]   # start the retriever and the trainer
#
# Environment (defaults in brackets):
#   VENV [.venv-easyr1]  EASYR1_DIR [.easyr1]  EASYR1_COMMIT [b44b311]  PYTHON_BIN [python3]
#   DATA [data/vrag]  VAL_FRACTION [0.1]  SPLIT_BY [document]  ACTION_FORMAT [tags]
#   FLASH_ATTN_WHEEL [the flash-attn 2.8.3 release wheel for this python and torch]
#   DRY_RUN=1 prints the commands instead of running them.
# The versions come from scripts/easyr1/pins.txt. Paths are relative to the repository root;
# the script runs from any directory.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
VENV=${VENV:-.venv-easyr1}
EASYR1_DIR=${EASYR1_DIR:-.easyr1}
EASYR1_COMMIT=${EASYR1_COMMIT:-b44b311}
DATA=${DATA:-data/vrag}
PINS=scripts/easyr1/pins.txt

usage() { sed -n '2,18p' "$0" >&2; exit 2; }
say() { printf '[recipe] %s\n' "$*" >&2; }
run() {  # print, then run unless DRY_RUN
    printf '+ %s\n' "$*"
    if [ "${DRY_RUN:-0}" != 1 ]; then "$@"; fi
}
pin() { sed -n "s/^$1==//p" "$PINS"; }

setup() {
    run "${PYTHON_BIN:-python3}" -m venv "$VENV"
    local pip="$VENV/bin/pip" python="$VENV/bin/python"
    run "$pip" install --upgrade pip
    run "$pip" install -c "$PINS" torch torchvision
    # flash-attn from its release wheel (a source build takes hours): built for this torch, this
    # python and torch's C++ ABI, as EasyR1's image installs it.
    local wheel=${FLASH_ATTN_WHEEL:-}
    if [ -z "$wheel" ]; then
        local py abi
        py=$(if [ "${DRY_RUN:-0}" = 1 ]; then echo cp312; else "$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")'; fi)
        abi=$(if [ "${DRY_RUN:-0}" = 1 ]; then echo TRUE; else "$python" -c 'import torch; print(str(torch._C._GLIBCXX_USE_CXX11_ABI).upper())'; fi)
        wheel="https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/flash_attn-2.8.3+cu12torch$(pin torch | cut -d. -f1,2)cxx11abi${abi}-${py}-${py}-linux_x86_64.whl"
    fi
    run "$pip" install -c "$PINS" "$wheel"
    if [ ! -d "$EASYR1_DIR/.git" ]; then
        run git clone https://github.com/hiyouga/EasyR1 "$EASYR1_DIR"
    fi
    run git -C "$EASYR1_DIR" checkout "$EASYR1_COMMIT"
    # EasyR1's own requirements under the pins, then this project (its gpu extra is the same vLLM).
    run "$pip" install -c "$PINS" -e "$EASYR1_DIR"
    run "$pip" install -c "$PINS" -e ".[gpu,server]"
    run "$python" -c "from vrag_rollout.integrations.easyr1 import require_easyr1; import vllm, transformers, torch; \
require_easyr1(); print('EasyR1', '$EASYR1_COMMIT', 'vLLM', vllm.__version__, 'transformers', transformers.__version__, \
'torch', torch.__version__, 'CUDA', torch.cuda.is_available())"
}

vidoseek() {
    # ViDoSeek (the ViDoRAG / VRAG-RL benchmark): questions in the layout convert-dataset reads,
    # and the PDFs they ask about.
    local source="$DATA/source"
    run "$VENV/bin/pip" install -q "huggingface_hub[cli]"
    run "$VENV/bin/huggingface-cli" download autumncc/ViDoSeek vidoseek.json vidoseek_pdf_document.zip \
        --repo-type dataset --local-dir "$source"
    run "$VENV/bin/python" -m zipfile -e "$source/vidoseek_pdf_document.zip" "$source/pdfs"
    say "next: $0 data $source/vidoseek.json $source/pdfs"
}

data() {
    [ $# -eq 2 ] || usage
    local questions=$1 docs=$2 bin="$VENV/bin"
    [ -x "$bin/vrag-rollout" ] || bin=.venv/bin  # the CPU set-up also converts
    run "$bin/vrag-retriever" index "$docs" --out "$DATA/index"
    run "$bin/vrag-rollout" convert-dataset "$questions" --index "$DATA/index" --drop-missing \
        --out "$DATA/train.parquet" --val-out "$DATA/val.parquet" --val-fraction "${VAL_FRACTION:-0.1}" \
        --split-by "${SPLIT_BY:-document}" --action-format "${ACTION_FORMAT:-tags}" --report "$DATA/report.json"
}

train() {
    local config=examples/easyr1_vrag.yaml
    if [ $# -gt 0 ] && [ "${1#*=}" = "$1" ]; then
        config=$1
        shift
    fi
    run env PYTHON="$repo/$VENV/bin/python" bash scripts/train_easyr1.sh "$DATA/index" "$config" \
        "data.train_files=$DATA/train.parquet" "data.val_files=$DATA/val.parquet" "$@"
}

[ $# -ge 1 ] || usage
step=$1
shift
case $step in
    setup) setup "$@" ;;
    vidoseek) vidoseek "$@" ;;
    data) data "$@" ;;
    train) train "$@" ;;
    *) usage ;;
esac
