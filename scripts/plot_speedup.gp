# Speedup vs context from scripts/bench-gpu's summary.tsv.
#   gnuplot -e "in='bench-out/summary.tsv'; out='speedup.png'" scripts/plot_speedup.gp
# Left: our dense decode kernel against the best PyTorch SDPA backend
# (time ratio SDPA / ours; the target, no slower than 1.1x, is the dashed
# line).  Right: the Quest-style kernel at a 10% token budget against our
# dense kernel.  One line per batch size.
if (!exists("in")) in = 'bench-out/summary.tsv'
if (!exists("out")) out = 'speedup.png'
set terminal pngcairo size 1200,480 font ",10"
set output out
set datafile separator "\t"
set datafile missing "NA"
set logscale x 2
set xtics ("32K" 32768, "64K" 65536, "128K" 131072, "256K" 262144, "512K" 524288, "1M" 1048576, "2M" 2097152)
set xlabel "context (tokens per request)"
set grid
set key top left
set multiplot layout 1,2
set title "dense decode: SDPA (best backend) time / ours"
set ylabel "speedup over PyTorch SDPA"
plot for [b in "1 4 8"] in skip 1 using 2:(($1 == b+0) ? $9 : 1/0) with linespoints title "batch ".b, \
     1/1.1 with lines dashtype 2 lc rgb "gray" title "target (1.1x slower)"
set title "Quest (10% of tokens) over our dense kernel"
set ylabel "speedup over dense"
plot for [b in "1 4 8"] in skip 1 using 2:(($1 == b+0) ? $12 : 1/0) with linespoints title "batch ".b
unset multiplot
