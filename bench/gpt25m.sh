# The 25.4M-parameter gpt the checkpoint benches share (8 blocks, 512 wide, 8 heads, context 64;
# global batch 8 in micro-batches of 2 on CPU, no evaluation, logs or metrics): `source` it, then
# add the run's own settings to "${gpt25m[@]}".
# shellcheck disable=SC2034  # used by the scripts that source it
gpt25m=(--config configs/gpt-tiny.yaml --set model.num_layers=8 --set model.d_model=512
        --set model.heads=8 --set data.context=64 --set train.global_batch_size=8
        --set train.micro_batch_size=2 --set train.device=cpu --set train.warmup_steps=1
        --set train.eval_every=0 --set log.progress=off --set log.metrics=off)
