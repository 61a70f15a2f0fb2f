# The Apptainer image every training rank runs in (when container.enabled): the software
# environment, not the code (the checkout's src/ is bound in when a rank runs, and training has
# the trainer's sources as inputs), so only a new recipe rebuilds it, or an edit to the build
# command (its shape is a param: jobs/container.py build_signature; an edit elsewhere in the
# package rebuilds nothing). Training declares the .sif as an input, so a rebuilt image reruns training. The recipe
# belongs to the repository (--context), the image to the study (the working directory).
# Snakemake deletes the old image before the build (a job's outputs go first): a new file, made
# with the umask or the directory's default ACL (give containers/ one to share the image).
rule build_container:
    input:
        definition=repo_file(CONTAINER["definition"]),
    output:
        image=CONTAINER["image"],
    log:
        "logs/build_container/build.log",
    params:
        context=repo_file("."),
        build=apptainer.build_signature(),
    shell:
        "scalestudy container build {input.definition:q} {output.image:q} "
        "--context {params.context:q} > {log:q} 2>&1"
