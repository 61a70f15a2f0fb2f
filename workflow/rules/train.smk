# One training run = one job: its ranks start through srun on Slurm (one per GPU) or as local
# processes (scalestudy launch), after a system inventory of the job's allocation (launch
# --inventory: the image, a multi-GB .sif, read once for both its digests). Trainer
# sources and the image are inputs, so changing them reruns training; the flags and the rank
# layout are params, so changing them does too (not --pg-timeout-s and the checkpointing flags:
# resources, they do not change what a run measures). The Slurm time limit is the node-hour plan's
# estimate (its 95% upper end where the scaling model prices it) x plan.safety_factor plus the
# USR1 lead (study/estimate.py). Checkpoints go to results/checkpoints/{run}/ (not an output,
# nor are the run's side files: tensorboard/ where TensorBoard is installed, and on GPUs the
# NVML samples gpu_samples_rank<r>.csv; `--delete-all-output` leaves them); a
# failed or preempted job (SIGUSR1 before the time limit: exit 75 after a checkpoint) is retried
# and resumes there.
rule train:
    input:
        unpack(get_prepared_data),
        sources=get_trainer_sources,
        image=IMAGE,
    output:
        metrics="results/runs/{run}/metrics.json",
        epochs="results/runs/{run}/epochs.csv",
        system="results/system/{run}.json",
    log:
        "logs/train/{run}.log",
    benchmark:
        "benchmarks/train/{run}.tsv"
    retries: get_train_retries()
    threads: get_threads
    resources:
        **LAUNCH_RESOURCES,
        runtime=PLAN.runtime,
        slurm_extra=resources.slurm_extra(config),
        # resources, not params: params are a rerun trigger, and where and how often a run
        # checkpoints does not change what it measures
        checkpoint_dir=get_checkpoint_dir,
        checkpoint_every=CHECKPOINTING["every_epochs"],
        checkpoint_keep=CHECKPOINTING["keep"],
    params:
        **LAUNCH_PARAMS,
        flags=get_train_flags,
        data_dir=subpath(input.meta, ancestor=2),
        out=subpath(output.metrics, parent=True),
    shell:
        launch_shell(
            "scalestudy launch --inventory {output.system:q}",
            "--out {params.out:q} --checkpoint-dir={resources.checkpoint_dir:q} "
            "--checkpoint-every {resources.checkpoint_every} "
            "--checkpoint-keep {resources.checkpoint_keep} > {log:q} 2>&1",
        )
