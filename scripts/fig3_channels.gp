# Fig. 3 analogue: attention-output error vs channel compression, all
# methods selecting 10% of the tokens per decode step.
#   gnuplot -e "in='fig3_channels.tsv'; out='fig3_channels.png'; model='...'" scripts/fig3_channels.gp
# in: series keep_frac ratio rel_l2_mean recall_mean rel_l2_all
# (scripts/figures extracts it from the sweep), rows of a series sorted by
# keep_frac; rel_l2_all is the error of the same caches when every token is
# attended (mkv-attend --budget 1): the right panel.
# keep_frac is the share of each vector's elements stored: the keep
# parameter for naive2d, uniform2d and mosaic fixed, the measured mean
# r/head_dim for mosaic dynamic (one point per loss threshold).
if (!exists("in")) in = 'docs/figures/fig3_channels.tsv'
if (!exists("out")) out = 'docs/figures/fig3_channels.png'
if (!exists("model")) model = 'data/sample.h5'

set terminal pngcairo size 900,380 font "DejaVu Sans,9"
set output out
set datafile separator tab
set multiplot layout 1,2 title sprintf("Error vs channel compression (%s)", model)

series = "naive2d uniform2d mosaic-fixed mosaic-dynamic"
array labels[4] = ["naive2d (Quest pages + one channel mask)", "uniform2d (SVD + one channel set)", \
                   "mosaic fixed (SVD + per-vector top-r)", "mosaic dynamic (threshold sweep)"]
colors = "#ff7f0e #2ca02c #1f77b4 #d62728"
points = "5 13 7 9"
is(i) = strcol(1) eq word(series, i)

set grid lc rgb "#dddddd"
set key bottom left Left reverse samplen 2 font ",8"
set xtics ("1/8" 0.125, "1/4" 0.25, "3/8" 0.375, "1/2" 0.5, "3/4" 0.75, "1" 1)
set xrange [0.08:1.04]
set xlabel "fraction of each vector's elements kept"

set title "10% of the tokens per step"
set ylabel "mean relative L2 error of the attention output"
set yrange [0:1]
plot for [i = 1:words(series)] in using (is(i) ? $2 : 1/0):4 with linespoints \
     lw 2 pt int(word(points, i)) lc rgb word(colors, i) title labels[i]

set title "channel compression alone: every token attended"
unset key
plot for [i = 1:words(series)] in using (is(i) ? $2 : 1/0):(strcol(6) eq "NA" ? 1/0 : $6) with linespoints \
     lw 2 dt 2 pt int(word(points, i)) lc rgb word(colors, i) title labels[i]
unset multiplot
