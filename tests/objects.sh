# Sourced by the checks that read the library's object files: fills the array
# `objects` from arguments that are object files (CMake's
# $<TARGET_OBJECTS:...>, which may arrive as one ;-separated argument) or
# directories to search for them, such as
# build-test/CMakeFiles/pinmem_objects.dir. An object is named by its path
# below src/, without ".c.o" (object_name).
objects=()
for arg in "$@"; do
    IFS=';' read -r -a parts <<<"$arg"
    for p in "${parts[@]}"; do
        if [ -d "$p" ]; then
            while IFS= read -r o; do objects+=("$o"); done < <(find "$p" -name '*.o' | sort)
        elif [ -n "$p" ]; then
            objects+=("$p")
        fi
    done
done
[ ${#objects[@]} -gt 0 ] || { echo "${0##*/}: no object files given"; exit 2; }

object_name() {
    local name=${1##*/src/}
    name=${name%.o}
    echo "${name%.c}"
}
