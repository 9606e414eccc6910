# Perplexity increase over the full cache against physical compression
# ratio, one point per setting and context, from docs/accuracy/ppl.tsv
# (scripts/accuracy).
#   gnuplot -e "in='docs/accuracy/ppl.tsv'; out='docs/figures/accuracy_ppl.png'" scripts/fig_accuracy.gp
# columns used: 4 method, 8 ppl_increase_pct, 11 physical_ratio
if (!exists("in")) in = 'docs/accuracy/ppl.tsv'
if (!exists("out")) out = 'docs/figures/accuracy_ppl.png'

set terminal pngcairo size 820,520 font "DejaVu Sans,9"
set output out
set datafile separator tab
set key outside right top
set logscale x 2
set xlabel "physical compression ratio of the prefix (dense 16-bit / stored bytes)"
set ylabel "perplexity increase over the full cache (%)"
set grid
set yrange [-5:35]
set title "points above 35% are off the plot (see the tables)" font ",8"
methods = "quest mosaic uniform2d kivi snapkv streaming think naive2d turboquant cam"
colors = "#7f7f7f #d62728 #2ca02c #e377c2 #17becf #9467bd #8c564b #ff7f0e #bcbd22 #1f77b4"
plot for [i=1:words(methods)] in using (stringcolumn(4) eq word(methods, i) ? $11 : 1/0):8 \
    with points pt 7 ps 1.2 lc rgb word(colors, i) title word(methods, i)
