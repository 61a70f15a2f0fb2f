# One training run = one job: its ranks start through srun on Slurm (one per GPU) or as local
# processes (scalestudy launch), after a system inventory of the job's allocation. Trainer sources and the image are inputs, so changing them
# reruns training; the flags and the rank layout are params, so changing them does too.
# Checkpoints go to results/checkpoints/{run}/ (not an output); a failed or preempted job
# (SIGUSR1 before the time limit: exit 75 after a checkpoint) is retried and resumes there.
rule train:
    input:
        unpack(get_prepared_data),
        sources=TRAINER_SOURCES,
        image=get_container_image,
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
        nodes=get_nodes,
        tasks_per_node=get_tasks_per_node,
        tasks=get_tasks,
        tasks_per_gpu=0,
        gres=get_gres,
        cpus_per_task=config["hardware"]["cpus_per_rank"],
        mem_mb=get_mem_mb,
        runtime=get_runtime,
        mpi=get_mpi,
        slurm_extra=get_slurm_extra,
        checkpoint_every=get_checkpoint_every,
        checkpoint_keep=get_checkpoint_keep,
    params:
        flags=get_train_flags,
        layout=get_layout,
        container=get_container_flags,
        data_dir=subpath(input.meta, ancestor=2),
        out=subpath(output.metrics, parent=True),
        checkpoint_dir=get_checkpoint_dir,
        inventory=get_inventory_flags,
    shell:
        "scalestudy inventory --out {output.system:q} {params.inventory:q} > {log:q} 2>&1 && "
        "scalestudy launch --mpi={resources.mpi:q} --nodes {params.layout[nodes]} "
        "--ranks-per-node {params.layout[ranks_per_node]} "
        "--cpus-per-rank {params.layout[cpus_per_rank]} {params.container:q} -- "
        "{params.flags:q} --data-dir {params.data_dir:q} --out {params.out:q} "
        "--checkpoint-dir={params.checkpoint_dir:q} "
        "--checkpoint-every {resources.checkpoint_every} "
        "--checkpoint-keep {resources.checkpoint_keep} >> {log:q} 2>&1"
