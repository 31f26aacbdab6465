#!/usr/bin/env bash
# Multi-node pretraining through the DeepSpeed launcher: one `logos pretrain` process per GPU on
# every host of the hostfile. Run it on the first host, from the repository root.
#
#   pretrain/launch_multinode.sh [RECIPE] [HOSTFILE] [extra `logos pretrain` flags...]
#   pretrain/launch_multinode.sh pretrain/8b.yaml pretrain/hostfile.example --resume
#
# Size the job first: `logos plan --config RECIPE --gpus-per-node 8 --nodes N`.
# PRINT_ONLY=1 prints the launcher command instead of running it.
set -euo pipefail
RECIPE=${1:-pretrain/8b.yaml}
HOSTFILE=${2:-pretrain/hostfile.example}
shift $(( $# < 2 ? $# : 2 ))
[[ -f $RECIPE ]] || { echo "launch_multinode: no recipe $RECIPE" >&2; exit 2; }
[[ -f $HOSTFILE ]] || { echo "launch_multinode: no hostfile $HOSTFILE" >&2; exit 2; }
hosts=$(grep -Ev '^[[:space:]]*(#|$)' "$HOSTFILE")
NODES=$(wc -l <<<"$hosts")
MASTER_ADDR=${MASTER_ADDR:-$(awk 'NR==1{print $1}' <<<"$hosts")}
MASTER_PORT=${MASTER_PORT:-29500}
# NCCL over InfiniBand/RoCE when present; set NCCL_SOCKET_IFNAME to the cluster interface if needed.
export NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
cmd=(deepspeed --hostfile "$HOSTFILE" --num_nodes "$NODES" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
     --module logos.cli pretrain --config "$RECIPE" "$@")
if [[ ${PRINT_ONLY:-0} == 1 ]]; then printf '%q ' "${cmd[@]}"; echo; else exec "${cmd[@]}"; fi
