# The Apptainer image every training rank runs in (when container.enabled). Training declares
# the .sif as an input, so a rebuilt image (new recipe or package source) reruns training. The
# recipe and the files its %files copy belong to the repository (--context), the image to the
# study (the working directory).
rule build_container:
    input:
        sources=get_container_sources,
    output:
        image=CONTAINER["image"],
    log:
        "logs/build_container/build.log",
    params:
        definition=repo_file(CONTAINER["definition"]),
        context=repo_file("."),
    shell:
        "scalestudy container build {params.definition:q} {output.image:q} "
        "--context {params.context:q} > {log:q} 2>&1"
