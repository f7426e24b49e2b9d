# Efficiency per shape (fraction of the copy bandwidth at 3 / 5 passes).
# Called by syncbn-bench: gnuplot -e "dat='...'; out='...'" bench/plot_cpu.gp
# dat columns: index, shape label, then forward/backward efficiency for
# float32 CF, float32 CL, bfloat16 CF, bfloat16 CL.
set terminal pngcairo size 1600,700 noenhanced font ",10"
set output out
set title "syncbn CPU kernels: efficiency vs copy bandwidth (forward at 3 passes, backward at 5)"
set ylabel "fraction of copy bandwidth"
set yrange [0:1.4]
set grid ytics
set key outside right top
set xtics rotate by -45
set style data linespoints
plot dat using 1:3:xtic(2) title "fwd f32 CF", \
     dat using 1:4 title "bwd f32 CF", \
     dat using 1:5 title "fwd f32 CL", \
     dat using 1:6 title "bwd f32 CL", \
     dat using 1:7 title "fwd bf16 CF" dashtype 2, \
     dat using 1:8 title "bwd bf16 CF" dashtype 2, \
     dat using 1:9 title "fwd bf16 CL" dashtype 2, \
     dat using 1:10 title "bwd bf16 CL" dashtype 2, \
     0.85 title "goal 0.85" lc rgb "black" dashtype 3 with lines
