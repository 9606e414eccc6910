# Fig. 4 analogue: share of each vector's top-25% elements that lie in the
# global top-25% channels of its context window, vs context length, for
# keys and values, raw and after the per-window SVD rotation.
#   gnuplot -e "in='fig4_overlap.tsv'; out='fig4_overlap.png'; model='...'; lengths='256,512'" \
#       scripts/fig4_overlap.gp
# in: tensor rotated length heads mean min max (scripts/figures makes it
# from mkv-analyze overlap): mean over layers x KV heads, band = min..max
# of the per-layer-and-head means.
if (!exists("in")) in = 'docs/figures/fig4_overlap.tsv'
if (!exists("out")) out = 'docs/figures/fig4_overlap.png'
if (!exists("model")) model = 'data/sample.h5'
if (!exists("lengths")) lengths = '256,512,1024,2048'

set terminal pngcairo size 900,380 font "DejaVu Sans,9"
set output out
set datafile separator tab
set multiplot layout 1,2 title sprintf("Per-vector vs global top-25%% channel overlap (%s)", model)

set logscale x 2
eval sprintf("set xtics (%s)", lengths)
set xrange [200:*]
set offsets 0, graph 0.05, 0, 0
set xlabel "context length (tokens)"
set ylabel "overlap (%)"
set yrange [0:100]
set grid ytics lc rgb "#dddddd"
set key bottom right Left reverse opaque samplen 2 font ",8"
set style fill transparent solid 0.15 noborder

sel(t, r) = (strcol(1) eq t && $2 == r)
curves(t) = sprintf("in using (sel('%s', 1) ? $3 : 1/0):($6 * 100):($7 * 100) with filledcurves lc rgb '#1f77b4' notitle, \
    in using (sel('%s', 0) ? $3 : 1/0):($6 * 100):($7 * 100) with filledcurves lc rgb '#ff7f0e' notitle, \
    in using (sel('%s', 1) ? $3 : 1/0):($5 * 100) with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'rotated (SVD): mean, min-max band', \
    in using (sel('%s', 0) ? $3 : 1/0):($5 * 100) with linespoints lw 2 pt 5 dt 2 lc rgb '#ff7f0e' title 'raw channels: mean, min-max band', \
    25 with lines dt 3 lc rgb '#888888' title 'chance (25%%)'", t, t, t, t)

set title "keys (post-RoPE)"
k = curves("k")
plot @k, \
     '+' using (256):(62.28) every ::0::0 with points pt 9 ps 1.8 lc rgb "#d62728" \
         title "paper: 62.28% (LLaMA-3.1-8B keys, rotated, 256 tokens)"
set title "values"
v = curves("v")
plot @v
unset multiplot
