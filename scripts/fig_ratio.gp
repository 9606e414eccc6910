# Fidelity of every method vs its physical compression ratio and vs the
# bytes a decode step reads, from the sweep of scripts/sweep-methods.
#   gnuplot -e "in='sweep.tsv'; outdir='docs/figures'; model='...'" scripts/fig_ratio.gp
# writes outdir/fig_ratio.png (mean relative L2 error of the attention
# output vs physical ratio), fig_ratio_recall.png (attention-mass recall vs
# physical ratio) and fig_bytes_read.png (error vs bytes read per step).
# full has error 0 and stays off the log-scale error plots.
# in: the sweep TSV, rows of a series sorted by ratio (scripts/figures
# sorts them); columns used: 1 series, 5 tokens, 6 ratio, 9 rel_l2_mean,
# 12 recall_mean, 16 read_frac.
if (!exists("in")) in = 'docs/figures/sweep.tsv'
if (!exists("outdir")) outdir = 'docs/figures'
if (!exists("model")) model = 'data/sample.h5'

set terminal pngcairo size 820,520 font "DejaVu Sans,9"
set datafile separator tab

series = "full quest think kivi2 kivi4 snapkv streaming naive2d uniform2d mosaic-fixed mosaic-dynamic"
labels = "full quest think kivi-2bit kivi-4bit snapkv* streaming naive2d uniform2d mosaic-fixed mosaic-dynamic"
colors = "#000000 #7f7f7f #8c564b #bcbd22 #e377c2 #17becf #9467bd #ff7f0e #2ca02c #1f77b4 #d62728"
points = "3 12 8 10 11 6 4 5 13 7 9"
# what a step attends: select = top blocks/pages at the token budget,
# evict = the tokens kept at compression, all = every token
kind(i) = (i <= 1 || (i >= 3 && i <= 5)) ? "all" : (i == 6 || i == 7) ? "evict" : "select"
tag(i) = kind(i) eq "select" ? " [10%/step]" : kind(i) eq "evict" ? " [evicts]" : " [all tokens]"
dash(i) = kind(i) eq "select" ? 1 : kind(i) eq "evict" ? 2 : 3
is(i) = strcol(1) eq word(series, i)

set grid lc rgb "#dddddd"
set key outside right top Left reverse samplen 3 font ",8"
set logscale x 2

set output outdir . '/fig_ratio.png'
set title sprintf("Attention-output error vs physical compression (%s)\nfull: error 0 at 1x; * SnapKV's observation queries are among the evaluated ones (optimistic)", model)
set xlabel "physical compression ratio (logical / physical bytes, log scale)"
set ylabel "mean relative L2 error of the attention output"
set logscale y
set yrange [0.02:1.5]
set arrow 1 from 3, graph 0 to 3, graph 1 nohead dt 3 lc rgb "#444444"
plot for [i = 2:words(series)] in using (is(i) ? $6 : 1/0):($9 > 0 ? $9 : 1/0) with linespoints \
     lw 1.5 dt dash(i) pt int(word(points, i)) lc rgb word(colors, i) title word(labels, i) . tag(i)

set output outdir . '/fig_ratio_recall.png'
set title sprintf("Attention-mass recall vs physical compression (%s)", model)
set ylabel "recall: exact softmax mass of the attended tokens"
unset logscale y
set yrange [0.5:1.02]
plot for [i = 1:words(series)] in using (is(i) ? $6 : 1/0):12 with linespoints \
     lw 1.5 dt dash(i) pt int(word(points, i)) lc rgb word(colors, i) title word(labels, i) . tag(i)

set output outdir . '/fig_bytes_read.png'
set title sprintf("Attention-output error vs bytes read per decode step (%s)\nfull: error 0 at 1; * SnapKV optimistic (observation queries evaluated)", model)
set xlabel "bytes read per step / dense 16-bit K+V bytes (per KV head, log scale)"
set logscale x 10
set xtics (0.02, 0.05, 0.1, 0.2, 0.5, 1)
set format x "%g"
set ylabel "mean relative L2 error of the attention output"
set logscale y
set yrange [0.02:1.5]
unset arrow 1
plot for [i = 2:words(series)] in using (is(i) ? $16 : 1/0):($9 > 0 ? $9 : 1/0) with linespoints \
     lw 1.5 dt dash(i) pt int(word(points, i)) lc rgb word(colors, i) title word(labels, i) . tag(i)
