# The Apptainer image every training rank runs in (when container.enabled). Training declares
# the .sif as an input, so a rebuilt image (new recipe or package source) reruns training.
rule build_container:
    input:
        sources=get_container_sources,
    output:
        image=CONTAINER["image"],
    log:
        "logs/build_container/build.log",
    params:
        definition=CONTAINER["definition"],
    shell:
        "scalestudy container build {params.definition:q} {output.image:q} "
        "> {log:q} 2>&1"
