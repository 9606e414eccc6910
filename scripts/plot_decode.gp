# Time between tokens and throughput vs context per method, from the TSV
# that scripts/bench-decode writes (FILL=1 GPU runs at batch 1):
#   gnuplot -e "in='docs/bench/decode-gpu-2026-12-04-fill-methods-llama3.1-8b.tsv'; out='decode-gpu.png'" \
#       scripts/plot_decode.gp
# Left: median step time (ms), right: tokens per second, one line per
# method (full, quest, mosaic), context on a log axis.  Contexts are read
# with their K/M suffixes; rows of other batch sizes are left out.
if (!exists("in")) in = 'bench.tsv'
if (!exists("out")) out = 'decode-gpu.png'
set terminal pngcairo size 1200,480 font ",10"
set output out
set datafile separator "\t"
set logscale x 2
set xtics ("128K" 131072, "256K" 262144, "512K" 524288, "1M" 1048576, "2M" 2097152)
set xlabel "context (tokens per request)"
set grid
set key top left Left reverse box opaque samplen 2
# context in tokens, the method, then the named column
rows(m, col) = sprintf("< awk -F'\t' -v m='%s' 'NR > 1 && $4 == m && ($18 == \"\" || $18 == 1) { c = $1; f = 1; if (c ~ /K$/) f = 1024; if (c ~ /M$/) f = 1048576; sub(/[KM]$/, \"\", c); print c * f \"\t\" $%d }' '%s'", m, col, in)
set multiplot layout 1,2 title "mkv-decode on the GPU, Llama-3.1-8B shape, fp16 weights, batch 1, 10% of tokens for quest and mosaic"
set ylabel "median step (ms)"
set yrange [0:*]
plot rows("full", 7) using 1:2 with linespoints pt 7 title "full", \
     rows("quest", 7) using 1:2 with linespoints pt 5 title "quest 10%", \
     rows("mosaic", 7) using 1:2 with linespoints pt 9 title "mosaic 10%"
set ylabel "tokens / s"
plot rows("full", 9) using 1:2 with linespoints pt 7 title "full", \
     rows("quest", 9) using 1:2 with linespoints pt 5 title "quest 10%", \
     rows("mosaic", 9) using 1:2 with linespoints pt 9 title "mosaic 10%"
unset multiplot
