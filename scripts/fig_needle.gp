# Passkey accuracy per length and depth, one panel per setting, from the
# per-cell table accuracy-report writes (label, length, depth, accuracy,
# full-cache accuracy; tab-separated; labels with _ for blanks, given in
# `labels` separated by blanks).
#   gnuplot -e "in='cells.tsv'; labels='quest_10% mosaic_3x'; out='docs/figures/accuracy_needle.png'" scripts/fig_needle.gp
if (!exists("in")) in = 'cells.tsv'
if (!exists("out")) out = 'docs/figures/accuracy_needle.png'
set terminal pngcairo size 1000,330 font "DejaVu Sans,9" noenhanced
set output out
set datafile separator tab
n = 0
do for [i = 1:100] { if (strlen(word(labels, i)) > 0) { n = i } }
set multiplot layout 1, n + 1 title "passkey accuracy (exact match of the greedy answer)"
set palette defined (0 "#d73027", 0.5 "#fee08b", 1 "#1a9850")
set cbrange [0:1]
unset colorbox
set logscale y 2
set yrange [700:6000]
set ytics (1024, 2048, 4096)
set xrange [-0.3:1.3]
# a label as written: blanks for its underscores
blank(s) = strstrt(s, "_") ? s[1:strstrt(s, "_") - 1] . " " . blank(s[strstrt(s, "_") + 1:]) : s
set xtics ("0" 0, "0.5" 0.5, "1" 1)
set xlabel "depth"
set ylabel "prompt tokens"
set title "full cache" font ",9"
plot in using (stringcolumn(1) eq word(labels, 1) ? $3 : 1/0):2:5 with points pt 5 ps 4 lc palette notitle
unset ylabel
do for [i = 1:n] {
    set title blank(word(labels, i)) font ",9"
    plot in using (stringcolumn(1) eq word(labels, i) ? $3 : 1/0):2:4 with points pt 5 ps 4 lc palette notitle
}
unset multiplot
