#!/bin/sh
# Runs one rank of a test job ("$@") and records how its process ended: "<exit status> <wall-clock time>" in
# rank<r>.exit in the working directory (r: RANK for torch env:// ranks, OMPI_COMM_WORLD_RANK under mpirun). The
# time is taken once the process is gone, MPI_Finalize and interpreter teardown included (dist_helpers.Launch).
"$@"
rc=$?
r=${RANK:-${OMPI_COMM_WORLD_RANK:-unknown}}
echo "$rc $(date +%s.%N)" > "rank${r}.exit.tmp" && mv "rank${r}.exit.tmp" "rank${r}.exit"
exit $rc
