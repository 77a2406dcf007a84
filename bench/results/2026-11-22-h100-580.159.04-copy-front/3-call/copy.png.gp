set terminal pngcairo size 1000,620
set output 'copy.png'
set title 'Copy bandwidth against size, pageable host memory (NVIDIA H100 80GB HBM3)'
set logscale x 2
set format x '%.0b%B'
set xlabel 'bytes per copy'
set ylabel 'GB/s'
set key top left
set grid
plot 'copy.png.dat' using 1:2 with linespoints lw 2 title 'pinmem, host to device', '' using 1:3 with linespoints lw 2 title 'driver, host to device', '' using 1:4 with linespoints lw 2 title 'pinmem, device to host', '' using 1:5 with linespoints lw 2 title 'driver, device to host', '' using 1:6 with lines dt 2 lw 2 title 'driver from pinned memory, host to device'
