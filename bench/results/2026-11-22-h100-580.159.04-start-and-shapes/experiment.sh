cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF >/dev/null 2>&1 && cmake --build /tmp/b -j16 >/dev/null 2>&1 || exit 1
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for pass in 1 2 3; do
  for v in base c8x4 c8x6 c2x16; do
    case $v in base) e="";; c8x4) e="PINMEM_COPY_CHUNK=8M PINMEM_COPY_BUFFERS=4";; c8x6) e="PINMEM_COPY_CHUNK=8M PINMEM_COPY_BUFFERS=6";; c2x16) e="PINMEM_COPY_CHUNK=2M PINMEM_COPY_BUFFERS=16";; esac
    echo "== pass $pass variant $v"
    env PMX_TRACE=1 $e /tmp/b/tools/pinmem bench copy > /tmp/o.txt 2>&1
    grep -E "^(16 MiB|64 MiB|256 MiB|1 GiB|\((workers|pageable))" /tmp/o.txt
    grep trace /tmp/o.txt > /tmp/t.txt; cat /tmp/t.txt >> $OUT/trace.txt
    sed -E 's/.*first dma ([0-9.]+) us, last dma ([0-9.]+), returned ([0-9.]+), synced ([0-9.]+).*/\1 \2 \3 \4/' /tmp/t.txt | awk '$4 > 0 {n++; f+=$1; l+=$2; r+=$3; s+=$4} END {if (n) printf "trace mean over %d: first %.0f last %.0f ret %.0f synced %.0f us\n", n, f/n, l/n, r/n, s/n}'
  done
done
