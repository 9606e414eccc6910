# Speedup vs context from scripts/bench-gpu's summary.tsv.
#   gnuplot -e "in='bench-out/summary.tsv'; out='speedup.png'" scripts/plot_speedup.gp
# Four panels, one line per batch size (1, 4, 8), context on a log axis:
#   top left:     our dense decode kernel against the best PyTorch SDPA
#                 backend (time ratio SDPA / ours, column sdpa_over_dense);
#                 target: no slower than 1.1x SDPA at >= 128K tokens;
#   top right:    packed MosaicKV at a 10% token budget over our dense
#                 kernel (packed10_speedup); target: >= 12x at 256K x 4;
#   bottom left:  packed MosaicKV over the Quest-style kernel at the same
#                 10% budget (packed10_over_quest10); target: >= 2x at
#                 256K x 4;
#   bottom right: Quest at 10% over our dense kernel (quest10_speedup), for
#                 scale.
# Targets are dashed gray lines (a circle marks 256K x 4 on the packed
# panels, whose measured point there is labelled with its value).  Columns
# are read by position (summary.tsv's order); the x range follows the data.
if (!exists("in")) in = 'bench-out/summary.tsv'
if (!exists("out")) out = 'speedup.png'
batches = "1 4 8"
set terminal pngcairo size 1300,940 font ",10"
set output out
set datafile separator "\t"
set datafile missing "NA"
set logscale x 2
stats in skip 1 using 2 nooutput
set xrange [STATS_min / 1.35 : STATS_max * 1.35]
set xtics ("32K" 32768, "64K" 65536, "128K" 131072, "256K" 262144, "512K" 524288, "1M" 1048576, "2M" 2097152)
set xlabel "context (tokens per request)"
set grid
set key top left Left reverse box opaque samplen 2
set style line 1 lc rgb "#1f77b4" lw 2 pt 7 ps 1.1
set style line 2 lc rgb "#d62728" lw 2 pt 5 ps 1.1
set style line 3 lc rgb "#2ca02c" lw 2 pt 9 ps 1.3
set style line 9 lc rgb "#555555" lw 1.5 dt 2
# the measured point at 256K x batch 4, labelled with its value
at2564(c) = ($1 == 4 && $2 == 262144) ? column(c) : 1/0
set multiplot layout 2,2 title "GPU decode attention, LLaMA-3.1-8B shape (32/8 heads, d 128, bf16): ".in font ",11"

set title "dense decode: SDPA (best backend) time / ours"
set ylabel "speedup over PyTorch SDPA"
set yrange [*:*]
set offsets 0, 0, graph 0.3, graph 0.05
plot for [i=1:words(batches)] in skip 1 using 2:(($1 == word(batches, i) + 0) ? $9 : 1/0) \
         with linespoints ls i title "batch ".word(batches, i), \
     1/1.1 with lines ls 9 title "target: no slower than 1.1x SDPA (>= 128K)", \
     1 with lines lc rgb "black" lw 0.5 notitle

set title "packed MosaicKV (10% of tokens, 25% of elements) over our dense kernel"
set ylabel "speedup over dense"
set yrange [0:*]
set offsets 0, 0, graph 0.35, 0
set label 1 "" at 262144, 12 point pt 6 ps 2.5 lc rgb "#555555"
plot for [i=1:words(batches)] in skip 1 using 2:(($1 == word(batches, i) + 0) ? $16 : 1/0) \
         with linespoints ls i title "batch ".word(batches, i), \
     12 with lines ls 9 title "target: >= 12x at 256K x 4 (circle)", \
     in skip 1 using 2:(at2564(16)):(sprintf("%.2fx", at2564(16))) with labels offset 2.5,-1 tc rgb "#d62728" notitle

set title "packed MosaicKV over the Quest-style kernel, both at 10% of tokens"
set ylabel "speedup over Quest"
set yrange [0:*]
set label 1 "" at 262144, 2 point pt 6 ps 2.5 lc rgb "#555555"
plot for [i=1:words(batches)] in skip 1 using 2:(($1 == word(batches, i) + 0) ? $17 : 1/0) \
         with linespoints ls i title "batch ".word(batches, i), \
     2 with lines ls 9 title "target: >= 2x at 256K x 4 (circle)", \
     1 with lines lc rgb "black" lw 0.5 notitle, \
     in skip 1 using 2:(at2564(17)):(sprintf("%.2fx", at2564(17))) with labels offset -3,1 tc rgb "#d62728" notitle

set title "Quest-style kernel (10% of tokens) over our dense kernel, for scale"
set ylabel "speedup over dense"
set yrange [0:*]
unset label 1
set offsets 0, 0, graph 0.15, 0
plot for [i=1:words(batches)] in skip 1 using 2:(($1 == word(batches, i) + 0) ? $12 : 1/0) \
         with linespoints ls i title "batch ".word(batches, i)
unset multiplot
