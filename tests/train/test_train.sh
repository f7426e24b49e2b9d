#!/usr/bin/env bash
# syncbn-train end to end (thread ranks; the MPI cases are in test_train_mpi.sh):
#  options: --help, --version, strict numbers, unknown options, unwritable --out, a file
#    given as --out or --checkpoint-dir, a forgotten value (the next option taken for it),
#    --resume without --checkpoint-dir, an empty --out, a --data that cannot load (the
#    earlier log in --out kept);
#  launchers: torchrun-style and Slurm variables are refused with the command that works;
#  training: 2 thread ranks reach the stated accuracy; --batch 1 trains (SyncBN over 4
#    ranks x 1 image == one rank x 4 images); local BN with batch 1 trains too;
#  resume: stopped + resumed == uninterrupted (checkpoints bit for bit, log rows equal,
#    the partial epoch marked); a different --batch/--ranks/data is refused; a checkpoint
#    position out of range (valid CRC) is refused; --resume without a resume file starts
#    afresh and says so, or is refused when a model file would be overwritten; a different
#    --momentum is refused naming both values, a different --lr/--weight-decay continues and
#    says so; --epochs below the checkpoint's position says what to do; a complete run
#    trains nothing (exit 0) and keeps its files; an empty resume file says it is empty;
#  signals: SIGINT and SIGTERM stop cleanly with a checkpoint that resumes (also when
#    timeout delivers the signal twice); a second SIGINT ends a blocked run at once;
#  files: stale temporary files of crashed saves are removed, live and foreign ones kept;
#    a checkpoint folder in use by a live run is refused;
#    a --out path with a quote and a newline is passed to gnuplot as data, not script;
#    a FIFO as the resume file, the log or the plot is refused at once, naming it; a
#    checkpoint that cannot be written (file size limit, full disk) fails with the reason.
set -u
bin=${1:-build/tools/syncbn-train}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
lockpid=
trap '[ -n "$lockpid" ] && kill $lockpid 2>/dev/null; mountpoint -q "$tmp/full_fs" && umount "$tmp/full_fs"; rm -rf "$tmp"' EXIT
fail=0
check() { # description, condition-exit-status
  if [ "$2" -eq 0 ]; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi
}
last_acc() { # csv mode -> final test accuracy in percent
  awk -F, -v m="$2" '$1 == m && $8 == "complete" { a = $5 } END { printf "%.1f", a * 100 }' "$1"
}
T() { timeout -k 5 300 "$@"; }

echo "# options"
"$bin" --help | grep -q -- "--checkpoint-dir"
check "--help lists the options" $?
"$bin" --version | grep -Eq '^syncbn-train [0-9]+\.[0-9]+\.[0-9]+'
check "--version prints the version ($("$bin" --version))" $?
# Numbers are decimal, an optional sign included; no spaces, hex, inf or nan
for bad in "--lr 0.1x" "--epochs 2.5" "--batch 0" "--ranks -1" "--momentum nan" "--train-size 4611686018427387904" \
           "--seed 1e3" "--bn sinc" "--lr 0x1p-3" "--lr inf" "--epochs 0x2" "--seed +-1" "--lr=.e1" "--lr=1e" \
           "--ranks=0x2" "--ranks=1_0"; do
  "$bin" $bad --out "$tmp/never" >"$tmp/o" 2>"$tmp/e"; rc=$?
  echo "    $bad -> exit $rc: $(head -1 "$tmp/e")"
  check "'$bad' is an error (exit 2, no training)" $(( rc != 2 || $(wc -c <"$tmp/o") != 0 ))
  [ $rc -eq 2 ] || sed 's/^/      | /' "$tmp/e" "$tmp/o" | head -60 # all of it (a sanitizer's report)
done
for one in "--ranks= 4" "--ranks=4 " "--seed= 7" "--lr= 0.1"; do # one word each, spaces included
  "$bin" "$one" --out "$tmp/never" >"$tmp/o" 2>"$tmp/e"; rc=$?
  echo "    '$one' -> exit $rc: $(head -1 "$tmp/e")"
  check "'$one' is an error (exit 2, no training)" $(( rc != 2 || $(wc -c <"$tmp/o") != 0 ))
done
T "$bin" --ranks +2 --batch +8 --lr +0.05 --bn sync --epochs 1 --train-size 64 --test-size 32 --quiet \
  --out "$tmp/plus" >"$tmp/o" 2>&1; rc=$?
grep -q "2 thread ranks x batch 8" "$tmp/o"
check "an explicit + sign is taken (--ranks +2 --batch +8 --lr +0.05: exit $rc)" $(( rc || $? ))
"$bin" --bogus >"$tmp/o" 2>"$tmp/e"; rc=$?
echo "    --bogus -> exit $rc:"; sed 's/^/      | /' "$tmp/e"
[ $rc -eq 2 ] && [ "$(wc -l <"$tmp/e")" -eq 2 ] && grep -q "unknown option '--bogus'" "$tmp/e" && grep -q -- "--help" "$tmp/e"
check "an unknown option prints one line and the --help hint" $?
mkdir -p "$tmp/ro"; touch "$tmp/ro/file"
"$bin" --out "$tmp/ro/file/sub" --epochs 1 >/dev/null 2>"$tmp/e"; rc=$?
echo "    --out under a file -> exit $rc: $(cat "$tmp/e")"
[ $rc -eq 2 ] && grep -q "is not a writable folder" "$tmp/e"
check "--out that cannot be a folder is a clear error" $?
for opt in --out --checkpoint-dir; do
  [ $opt = --out ] && other= || other="--out $tmp/nd"
  "$bin" $other $opt "$tmp/ro/file" --epochs 1 >/dev/null 2>"$tmp/e"; rc=$?
  echo "    $opt a regular file -> exit $rc: $(cat "$tmp/e")"
  [ $rc -eq 2 ] && grep -qF -- "$opt '$tmp/ro/file' is not a directory: it is a regular file" "$tmp/e"
  check "$opt naming a regular file says it is not a directory" $?
done
# A value forgotten: the next option must not become a folder named "--resume".
for args in "--checkpoint-dir --resume|--checkpoint-dir needs a value; got the option --resume" \
            "--data --out x|--data needs a value; got the option --out" \
            "-p --batch 2|-p needs a value; got the option --batch"; do
  rm -rf "$tmp/fv" && mkdir "$tmp/fv"
  (abs=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin"); cd "$tmp/fv" && "$abs" ${args%%|*} --epochs 1 >"$tmp/o" 2>"$tmp/e")
  rc=$?
  echo "    ${args%%|*} -> exit $rc: $(head -1 "$tmp/e")"
  [ $rc -eq 2 ] && grep -qxF -- "syncbn-train: ${args#*|}" "$tmp/e" && [ ! -s "$tmp/o" ] && [ -z "$(ls -A "$tmp/fv")" ]
  check "'${args%%|*}': the forgotten value is refused (exit 2), nothing created" $?
done

rm -rf "$tmp/nockpt" && mkdir "$tmp/nockpt"
(abs=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin"); cd "$tmp/nockpt" && "$abs" --resume --epochs 1 --out o >"$tmp/o" 2>"$tmp/e")
rc=$?
echo "    --resume without --checkpoint-dir -> exit $rc: $(head -1 "$tmp/e")"
[ $rc -eq 2 ] && grep -q -- "--resume needs --checkpoint-dir" "$tmp/e" && [ ! -s "$tmp/o" ] && [ -z "$(ls -A "$tmp/nockpt")" ]
check "--resume without --checkpoint-dir is refused (exit 2), nothing trained or created" $?
"$bin" --out "" --epochs 1 >/dev/null 2>"$tmp/e"; rc=$?
echo "    --out '' -> exit $rc: $(head -1 "$tmp/e")"
[ $rc -eq 2 ] && grep -qF -- "--out '' is not a writable folder" "$tmp/e"
check "an empty --out is refused" $?

# Data that cannot be loaded stops the run before the log of an earlier run in --out
# is replaced; a --data that names no source is a command-line error.
mkdir -p "$tmp/keeplog"
for spec in "nope|2" "mnist:|2" "mnist:$tmp/no-such-dir|1"; do
  echo "keep me" >"$tmp/keeplog/train_log.csv"
  "$bin" --data "${spec%|*}" --epochs 1 --out "$tmp/keeplog" >"$tmp/o" 2>"$tmp/e"; rc=$?
  echo "    --data '${spec%|*}' -> exit $rc: $(head -1 "$tmp/e")"
  [ $rc -eq "${spec#*|}" ] && [ "$(cat "$tmp/keeplog/train_log.csv")" = "keep me" ]
  check "--data '${spec%|*}': exit ${spec#*|}, the earlier log in --out kept" $?
done

echo "# launchers"
for envs in "RANK=0 WORLD_SIZE=2" "SLURM_PROCID=1 SLURM_NTASKS=4"; do
  env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK $envs "$bin" --epochs 1 --out "$tmp/l" >"$tmp/o" 2>"$tmp/e"; rc=$?
  echo "    $envs -> exit $rc: $(cat "$tmp/e")"
  [ $rc -eq 2 ] && grep -q "mpirun -np" "$tmp/e" && [ ! -s "$tmp/o" ]
  check "$envs: refused with the launch command, nothing trained" $?
done
env RANK=0 WORLD_SIZE=1 timeout -k 5 300 "$bin" --bn sync --ranks 2 --batch 4 --epochs 1 --train-size 64 --test-size 32 --quiet \
  --out "$tmp/l1" >/dev/null 2>&1
check "WORLD_SIZE=1 runs as a single process" $?

echo "# training"
small="--bn sync --batch 8 --epochs 4 --train-size 1024 --test-size 512 --quiet"
T "$bin" $small --ranks 2 --out "$tmp/threads" >"$tmp/threads.log" 2>&1
rc=$?
acc=$(last_acc "$tmp/threads/train_log.csv" syncbn)
echo "  2 thread ranks: final test accuracy $acc% (stated: >= 40%)"
check "2 thread ranks train to >= 40% test accuracy" $(( rc != 0 || ${acc%.*} < 40 ))
cp "$tmp/threads/train_log.csv" "$tmp/threads_log.csv" # for the MPI comparison

# --batch 1 with SyncBN: the statistics of 4 ranks x 1 image are those of one rank
# with 4 images; the runs match up to the order of float32 gradient sums
# (measured relative loss difference ~1e-4 after 2 epochs; tolerance 1e-3).
one="--bn sync --epochs 2 --train-size 256 --test-size 128 --quiet"
T "$bin" $one --ranks 4 --batch 1 --out "$tmp/b1" >"$tmp/b1.log" 2>&1; r1=$?
T "$bin" $one --ranks 1 --batch 4 --out "$tmp/b4" >/dev/null 2>&1; r4=$?
paste -d, "$tmp/b1/train_log.csv" "$tmp/b4/train_log.csv" | awk -F, 'NR > 1 {
    d = ($3 - $11) / $11; d = d < 0 ? -d : d; if (d > m) m = d; l = $3
    printf "    epoch %d: loss %s (4 ranks x 1) vs %s (1 rank x 4), rel diff %.2e\n", $2, $3, $11, d }
  END { exit !(NR == 3 && m < 1e-3 && l == l + 0 && l < 2.3) }'
check "--batch 1 --bn sync on 4 ranks trains like one rank with batch 4 (exit $r1, $r4)" $(( $? || r1 || r4 ))
T "$bin" --bn local --ranks 3 --batch 1 --epochs 1 --train-size 301 --test-size 64 --out "$tmp/l1b" >"$tmp/l1b.log" 2>&1
rc=$?
loss=$(awk -F, '$1 == "localbn" { print $3 }' "$tmp/l1b/train_log.csv")
grep -q "skipped the last 1 image" "$tmp/l1b.log"
echo "    local BN, 3 ranks x batch 1: loss $loss, exit $rc; $(grep skipped "$tmp/l1b.log")"
check "--batch 1 --bn local trains (finite loss) and reports the skipped tail" $(( rc || $? )) 
[ -n "$loss" ] && awk -v l="$loss" 'BEGIN { exit !(l == l + 0 && l > 0 && l < 10) }'
check "  ... its loss is a finite number" $?
"$bin" --bn local --ranks 4 --batch 1 --train-size 3 --test-size 8 --epochs 1 --quiet --out "$tmp/g0" >"$tmp/o" 2>"$tmp/e"
rc=$?
echo "    local BN, 4 ranks, 3 images -> exit $rc: $(tail -1 "$tmp/e")"
[ $rc -ne 0 ] && grep -q "ran no step" "$tmp/e" && ! grep -qi nan "$tmp/o"
check "an epoch in which no step can run is an error, never 'loss nan' with exit 0" $?
"$bin" --ranks 1 --batch 1 --out "$tmp/g1" >/dev/null 2>"$tmp/e"; rc=$?
echo "    --ranks 1 --batch 1 -> exit $rc: $(cat "$tmp/e")"
check "a global batch of 1 is refused" $(( rc != 2 ))

echo "# resume"
# 2 epochs of 16 steps; stop after 21 steps (epoch 2, step 5).
res="--bn sync --ranks 2 --batch 8 --epochs 2 --train-size 256 --test-size 128 --quiet"
T "$bin" $res --checkpoint-dir "$tmp/full" --out "$tmp/full" >/dev/null 2>&1; r1=$?
T "$bin" $res --checkpoint-dir "$tmp/part" --out "$tmp/part" --stop-after 21 >"$tmp/part1.log" 2>&1; r2=$?
grep -q interrupted "$tmp/part1.log"
check "--stop-after stops early and says so" $?
cp "$tmp/part/train_log.csv" "$tmp/part_log_1.csv"
T "$bin" $res --checkpoint-dir "$tmp/part" --out "$tmp/part" --resume >"$tmp/part2.log" 2>&1; r3=$?
same=0
for f in syncbn-train-syncbn.safetensors syncbn-train-syncbn.resume.safetensors; do
  cmp -s "$tmp/full/$f" "$tmp/part/$f" || same=1
done
check "stopped + resumed run ends with the same model and resume files bit for bit (runs: $r1 $r2 $r3)" $(( r1 || r2 || r3 || same ))
echo "    log of the interrupted run after resuming:"; sed 's/^/      | /' "$tmp/part/train_log.csv"
grep -c '^syncbn,2,.*,16,partial$' "$tmp/part_log_1.csv" >/dev/null; p1=$?
grep -q '^syncbn,2,.*,5,partial$' "$tmp/part/train_log.csv"; p2=$?
diff <(awk -F, '$8 == "complete"' "$tmp/full/train_log.csv" | cut -d, -f1-5) \
     <(awk -F, '$8 == "complete"' "$tmp/part/train_log.csv" | cut -d, -f1-5) >/dev/null; d=$?
check "the log keeps epoch 1, marks the partial epoch 2 (5 steps) and its complete rows equal the uninterrupted run's" \
  $(( p2 || d ))
for change in "--batch 4" "--ranks 3" "--train-size 300" "--seed 2"; do
  opts=$(echo "$res" | sed -E "s/--${change%% *} [0-9]+//")
  T "$bin" $opts $change --checkpoint-dir "$tmp/part" --out "$tmp/part" --resume >"$tmp/o" 2>"$tmp/e"; rc=$?
  echo "    resume with $change -> exit $rc: $(grep -o 'written by a run with.*differ' "$tmp/e" | head -1)"
  [ $rc -ne 0 ] && grep -q "written by a run with" "$tmp/e"
  check "resume with a different $change is refused with a message" $?
done
cp -r "$tmp/part" "$tmp/bad"
for pos in "trainer.epoch=2147483649" "trainer.epoch=1 trainer.step=-2" "trainer.epoch=0 trainer.step=16"; do
  cp "$tmp/part/syncbn-train-syncbn.resume.safetensors" "$tmp/bad/"
  /usr/bin/python3 "$here/ckpt_edit.py" "$tmp/bad/syncbn-train-syncbn.resume.safetensors" $pos >/dev/null
  T "$bin" $res --checkpoint-dir "$tmp/bad" --out "$tmp/bad" --resume >"$tmp/o" 2>"$tmp/e"; rc=$?
  echo "    $pos -> exit $rc: $(grep -o 'holds position.*steps' "$tmp/e" | head -1)"
  [ $rc -ne 0 ] && grep -q "outside this run" "$tmp/e"
  check "a checkpoint at $pos (valid CRC) is refused" $?
done

# --resume before any checkpoint (a job script that always passes it) starts afresh and
# says so; a model file without its resume file is refused, not overwritten
T "$bin" $res --checkpoint-dir "$tmp/fresh" --out "$tmp/fresh" --resume --stop-after 3 >"$tmp/o" 2>"$tmp/e"; rc=$?
echo "    --resume, no checkpoint yet -> exit $rc: $(grep 'resume:' "$tmp/o")"
[ $rc -eq 0 ] && grep -qx "  resume: no $tmp/fresh/syncbn-train-syncbn.resume.safetensors; starting at epoch 1" "$tmp/o"
check "--resume with no checkpoint yet starts at epoch 1 and says so" $?
model="$tmp/fresh/syncbn-train-syncbn.safetensors"
rm -f "$tmp/fresh/syncbn-train-syncbn.resume.safetensors"
sum=$(md5sum <"$model")
T "$bin" $res --checkpoint-dir "$tmp/fresh" --out "$tmp/fresh" --resume >"$tmp/o" 2>"$tmp/e"; rc=$?
echo "    --resume, model file only -> exit $rc: $(cat "$tmp/e")"
[ $rc -ne 0 ] && grep -q "model file alone cannot resume" "$tmp/e" && grep -q "remove it or use another --checkpoint-dir" "$tmp/e" &&
  [ "$(md5sum <"$model")" = "$sum" ] && [ ! -e "$tmp/fresh/syncbn-train-syncbn.resume.safetensors" ]
check "--resume with the model file but no resume file is refused and overwrites nothing" $?

# Options that differ from the checkpoint's, on a small finished run and a stopped one
# (16 images a step: 4 steps an epoch).
tiny="--bn sync --ranks 2 --batch 8 --epochs 2 --train-size 64 --test-size 16"
T "$bin" $tiny --quiet --checkpoint-dir "$tmp/tiny" --out "$tmp/tiny" >/dev/null 2>&1
check "a small run to resume (exit $?)" $?
sums() { md5sum "$tmp"/tiny/*.safetensors "$tmp/tiny/train_log.csv" | cut -d' ' -f1 | tr '\n' ' '; }
before=$(sums)
T "$bin" $tiny --quiet --checkpoint-dir "$tmp/tiny" --out "$tmp/tiny" --resume --momentum 0 >"$tmp/o" 2>"$tmp/e"; rc=$?
echo "    --resume --momentum 0 -> exit $rc: $(tail -1 "$tmp/e")"
[ $rc -eq 1 ] && grep -q "written by a run with --momentum 0.9 (now 0): the optimizer's momentum buffers" "$tmp/e" &&
  ! grep -q "unexpected key" "$tmp/e"
check "resume with a different --momentum is refused naming both values" $?
T "$bin" $tiny --quiet --checkpoint-dir "$tmp/tiny" --out "$tmp/tiny" --resume --epochs 1 >"$tmp/o" 2>"$tmp/e"; rc=$?
echo "    finished 2 epochs, --resume --epochs 1 -> exit $rc: $(tail -1 "$tmp/e")"
[ $rc -eq 1 ] && grep -q "stopped after 2 complete epochs, beyond this run's --epochs 1. To train it further, resume with --epochs 3 or more" "$tmp/e" &&
  ! grep -q "damaged" "$tmp/e"
check "resume with --epochs below the checkpoint's position says so and what to do" $?
T "$bin" $tiny --checkpoint-dir "$tmp/tiny" --out "$tmp/tiny" --resume >"$tmp/o" 2>"$tmp/e"; rc=$?
echo "    --resume on the finished run -> exit $rc:"; sed 's/^/      | /' "$tmp/o" "$tmp/e"
[ $rc -eq 0 ] && grep -q "the run is already complete (2 of 2 epochs); nothing to train" "$tmp/o" &&
  grep -q "SyncBN .*(already complete: nothing trained)" "$tmp/o" && ! grep -q "resumed from\|epoch 3\|not drawn" "$tmp/o" &&
  [ "$(sums)" = "$before" ]
check "--resume on a complete run trains nothing, says so, exits 0 and keeps the files and the log" $?
T "$bin" $tiny --quiet --checkpoint-dir "$tmp/tinyp" --out "$tmp/tinyp" --stop-after 2 >/dev/null 2>&1
T "$bin" $tiny --quiet --checkpoint-dir "$tmp/tinyp" --out "$tmp/tinyp" --resume --lr 0.5 --weight-decay 0 \
  >"$tmp/o" 2>"$tmp/e"; rc=$?
echo "    --resume --lr 0.5 --weight-decay 0 -> exit $rc:"; grep resume: "$tmp/o" | sed 's/^/      | /'
[ $rc -eq 0 ] && grep -qxF "  resume: --lr 0.5 (the checkpoint's run had 0.02); the run continues with 0.5" "$tmp/o" &&
  grep -qxF "  resume: --weight-decay 0 (the checkpoint's run had 0.0005); the run continues with 0" "$tmp/o"
check "resume with a different --lr / --weight-decay continues and says so" $?
: >"$tmp/tinyp/syncbn-train-syncbn.resume.safetensors"
T "$bin" $tiny --quiet --checkpoint-dir "$tmp/tinyp" --out "$tmp/tinyp" --resume >"$tmp/o" 2>"$tmp/e"; rc=$?
echo "    --resume from a 0-byte file -> exit $rc: $(tail -1 "$tmp/e")"
[ $rc -eq 1 ] && grep -qF "$tmp/tinyp/syncbn-train-syncbn.resume.safetensors is empty (0 bytes), not a resume checkpoint" "$tmp/e"
check "an empty resume file is refused saying it is empty" $?

echo "# signals"
for sig in INT TERM; do
  d="$tmp/sig$sig"
  # timeout passes the signal on to the program (and would SIGKILL it -k seconds later)
  timeout -k 60 120 "$bin" --bn sync --ranks 2 --batch 4 --epochs 50 --train-size 8000 --test-size 64 \
    --checkpoint-dir "$d" --out "$d" >"$d.log" 2>&1 &
  pid=$!
  # the program prints this line as training starts; then let a few steps run
  for _ in $(seq 600); do grep -q "SyncBatchNorm over all ranks" "$d.log" && break; sleep 0.1; done
  sleep 2
  kill -$sig $pid
  wait $pid; rc=$?
  # the last row is the stopped epoch's: partial, or complete when the stop
  # landed on an epoch's last step (the next epoch then starts on resume;
  # --stop-after above checks the partial rows deterministically)
  last=$(tail -n 1 "$d/train_log.csv" 2>/dev/null)
  grep -q interrupted "$d.log" && [ -s "$d/syncbn-train-syncbn.resume.safetensors" ] &&
    case $last in *,partial | *,complete) true ;; *) false ;; esac
  check "SIG$sig stops cleanly (exit $rc) with a checkpoint and the stopped epoch's log row (${last##*,})" \
    $(( rc != 0 || $? != 0 ))
done
T "$bin" --bn sync --ranks 2 --batch 4 --epochs 50 --train-size 8000 --test-size 64 --stop-after 3 \
  --checkpoint-dir "$tmp/sigTERM" --out "$tmp/sigTERM" --resume >"$tmp/int2.log" 2>&1
rc=$?; grep -q "resumed from" "$tmp/int2.log"
check "the SIGTERM-stopped run resumes (exit $rc)" $(( rc || $? ))
# A second signal ends a run that cannot reach the end of its step. Here the run is
# stuck in a write to its stdout (a pipe nobody reads, filled first), as a rank stuck in
# a collective would be: the first SIGINT cannot take effect, the second kills it with
# SIGINT's status (130) (a copy of the first that arrives with it does not), and the checkpoint folder keeps the last complete checkpoint,
# byte for byte, with no partial file beside it.
d="$tmp/sig2"; mkdir -p "$d"
small=(--bn sync --ranks 2 --batch 8 --train-size 64 --test-size 32 --quiet --checkpoint-dir "$d/ck" --out "$d")
T "$bin" "${small[@]}" --epochs 1 >/dev/null 2>&1
cp -r "$d/ck" "$d/ck.before"
mkfifo "$d/pipe"; exec 7<>"$d/pipe"; head -c 65536 /dev/zero >&7
"$bin" "${small[@]}" --epochs 2 --resume >&7 2>"$d/err" & pid=$!
for _ in $(seq 100); do [ "$(awk '{print $3}' /proc/$pid/stat 2>/dev/null)" = S ] && break; sleep 0.1; done
sleep 0.5
kill -INT $pid; kill -INT $pid; sleep 1   # one Ctrl-C delivered twice at once counts once
alive_after_one=$(kill -0 $pid 2>/dev/null && echo yes || echo no)
kill -INT $pid
t0=$(date +%s%N); ended=no
for _ in $(seq 50); do kill -0 $pid 2>/dev/null || { ended=yes; break; }; sleep 0.1; done
[ $ended = no ] && kill -KILL $pid
wait $pid; rc=$?; ms=$(( ($(date +%s%N) - t0) / 1000000 ))
exec 7>&-
echo "    blocked run: alive after one SIGINT: $alive_after_one; after the second: ended $ended in ${ms} ms, exit $rc;" \
  "checkpoint folder: $(ls "$d/ck" | tr '\n' ' ')"
[ $alive_after_one = yes ] && [ $ended = yes ] && [ $rc -eq 130 ] && diff -r "$d/ck.before" "$d/ck" >/dev/null &&
  [ -z "$(ls "$d/ck" | grep tmp-)" ]
check "a second SIGINT ends a blocked run at once (exit 130), the last checkpoint intact, no partial file" $?

echo "# files"
d="$tmp/stale"; mkdir -p "$d"
stale="$d/syncbn-train-syncbn.resume.safetensors.tmp-syncbn-Ab12Cd"
live="$d/syncbn-train-syncbn.safetensors.tmp-syncbn-Zz99Yy"
foreign1="$d/syncbn-train-syncbn.safetensors.tmp-notours"; foreign2="$d/other.safetensors.tmp-syncbn-Ab12Cd"
foreign3="$d/syncbn-train-syncbn.safetensors.tmp-backup"
for f in "$stale" "$live" "$foreign1" "$foreign2" "$foreign3"; do head -c 4096 /dev/urandom >"$f"; touch -d '1 hour ago' "$f"; done
flock "$live" sleep 120 & lockpid=$!   # a writer that is still alive holds its lock
sleep 0.5
T "$bin" --bn sync --ranks 2 --batch 8 --epochs 1 --train-size 64 --test-size 32 --quiet --checkpoint-dir "$d" --out "$d" \
  >/dev/null 2>&1; rc=$?
kill $lockpid 2>/dev/null; lockpid=
echo "    after a save: $(cd "$d" && ls | grep tmp- | tr '\n' ' ')"
[ $rc -eq 0 ] && [ ! -e "$stale" ] && [ -e "$live" ] && [ -e "$foreign1" ] && [ -e "$foreign2" ] && [ -e "$foreign3" ]
check "a save removes the stale temp file of a crashed save and keeps a live one and foreign names" $?
# Two runs into one checkpoint folder would overwrite each other's files: the second
# (here: a process holding the folder's lock, as a live run does) is refused at once.
d="$tmp/busy"; mkdir -p "$d"; echo "kept" >"$d/train_log.csv"
flock "$d" sleep 120 & lockpid=$!
sleep 0.5
T "$bin" --bn sync --ranks 2 --batch 8 --epochs 1 --train-size 64 --test-size 32 --quiet --checkpoint-dir "$d" --out "$d" \
  >"$tmp/o" 2>"$tmp/e"; rc=$?
kill $lockpid 2>/dev/null; lockpid=
echo "    --checkpoint-dir of a live run -> exit $rc: $(cat "$tmp/e")"
[ $rc -eq 2 ] && grep -qF -- "--checkpoint-dir '$d' is in use by another run" "$tmp/e" && [ ! -s "$tmp/o" ] &&
  [ "$(cat "$d/train_log.csv")" = kept ] && [ -z "$(ls "$d" | grep safetensors)" ]
check "a second run into a folder in use is refused (exit 2), its files untouched" $?
# The same for --out alone: two runs would overwrite each other's log and plot.
d="$tmp/busyout"; mkdir -p "$d"; echo "kept" >"$d/train_log.csv"
flock "$d" sleep 120 & lockpid=$!
sleep 0.5
T "$bin" --bn sync --ranks 2 --batch 8 --epochs 1 --train-size 64 --test-size 32 --quiet --out "$d" \
  >"$tmp/o" 2>"$tmp/e"; rc=$?
kill $lockpid 2>/dev/null; lockpid=
echo "    --out of a live run -> exit $rc: $(cat "$tmp/e")"
[ $rc -eq 2 ] && grep -qF -- "--out '$d' is in use by another run" "$tmp/e" && [ ! -s "$tmp/o" ] &&
  [ "$(cat "$d/train_log.csv")" = kept ] && [ ! -e "$d/train_curves.png" ]
check "a second run into an --out in use is refused (exit 2), its log untouched" $?
# Two live runs: the second, into the first one's --out (its own --checkpoint-dir), is refused.
d="$tmp/twoout"; mkdir -p "$d"
"$bin" --bn sync --ranks 2 --batch 4 --epochs 50 --train-size 8000 --test-size 64 --quiet --out "$d" \
  >"$tmp/first.log" 2>&1 & first=$!
for _ in $(seq 100); do [ -s "$d/train_log.csv" ] && break; sleep 0.1; done
T "$bin" --bn sync --ranks 2 --batch 8 --epochs 1 --train-size 64 --test-size 32 --quiet --out "$d" \
  --checkpoint-dir "$tmp/twoout-ck" >"$tmp/o" 2>"$tmp/e"; rc=$?
kill -INT $first; wait $first; rc1=$?
echo "    a second run into a live run's --out -> exit $rc: $(cat "$tmp/e"); the first: exit $rc1"
[ $rc -eq 2 ] && grep -qF -- "--out '$d' is in use by another run" "$tmp/e" && [ $rc1 -eq 0 ]
check "two live runs cannot share --out (the second exits 2, the first is unaffected)" $?
odd="$tmp/a'b
c\"; system(\"touch $tmp/pwned\"); \""
T "$bin" --bn both --ranks 2 --batch 8 --epochs 1 --train-size 64 --test-size 32 --quiet --out "$odd" >"$tmp/odd.log" 2>&1
rc=$?
[ $rc -eq 0 ] && [ -s "$odd/train_curves.png" ] && [ ! -e "$tmp/pwned" ] && grep -q "plot: " "$tmp/odd.log"
check "--out with a quote, a newline and gnuplot code: plot drawn there, nothing executed (exit $rc)" $?

# A FIFO would block the open until a writer (or reader) came, with the rank threads
# stuck where SIGTERM cannot stop them: refused at once, naming the file.
fifo_case() { # description, expected file, program arguments...
  local what=$1 file=$2; shift 2
  local t0=$SECONDS
  timeout -k 2 20 "$bin" "$@" >"$tmp/o" 2>"$tmp/e"; local rc=$?
  echo "    $what -> exit $rc after $((SECONDS - t0)) s: $(tail -1 "$tmp/e")"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && [ $((SECONDS - t0)) -le 10 ] &&
    grep -q "$file is a FIFO (named pipe); expected a regular file" "$tmp/e"
  check "$what: refused at once with a message naming it" $?
}
d="$tmp/fifo"; cp -r "$tmp/part" "$d"
rm "$d/syncbn-train-syncbn.resume.safetensors"; mkfifo "$d/syncbn-train-syncbn.resume.safetensors"
fifo_case "--resume from a FIFO" "$d/syncbn-train-syncbn.resume.safetensors" $res --checkpoint-dir "$d" --out "$d" --resume
mkdir -p "$tmp/fifo_log"; mkfifo "$tmp/fifo_log/train_log.csv"
fifo_case "a FIFO as the log" "$tmp/fifo_log/train_log.csv" $res --out "$tmp/fifo_log"
fifo_case "a FIFO as the log, --resume" "$tmp/fifo_log/train_log.csv" $res --out "$tmp/fifo_log" \
  --checkpoint-dir "$tmp/fifo_log" --resume
mkdir -p "$tmp/fifo_png"; mkfifo "$tmp/fifo_png/train_curves.png"
fifo_case "a FIFO as the plot" "$tmp/fifo_png/train_curves.png" $res --out "$tmp/fifo_png"

# A checkpoint that cannot be written fails with the library's reason, naming the file.
# The file size limit works unprivileged (SIGXFSZ ignored: write fails with EFBIG); a
# full tmpfs needs root.
save_fails() { # description, expected reason, checkpoint dir
  grep -q "writing $3/syncbn-train-syncbn.*failed: $2" "$tmp/e" && ! grep -q "no error message recorded" "$tmp/e"
  check "$1: the reason reaches the user" $?
}
d="$tmp/fsize"
(trap '' XFSZ; ulimit -f 8; exec timeout -k 5 120 "$bin" --bn sync --ranks 2 --batch 4 --epochs 1 --train-size 64 \
  --test-size 32 --quiet --checkpoint-dir "$d" --out "$d") >/dev/null 2>"$tmp/e"; rc=$?
echo "    checkpoint over the file size limit -> exit $rc: $(cat "$tmp/e")"
[ $rc -eq 1 ]; check "checkpoint over the file size limit: exit 1" $?
save_fails "checkpoint over the file size limit" "File too large" "$d"
mkdir -p "$tmp/full_fs"
if mount -t tmpfs -o size=16k tmpfs "$tmp/full_fs" 2>/dev/null; then
  T "$bin" --bn sync --ranks 2 --batch 4 --epochs 1 --train-size 64 --test-size 32 --quiet \
    --checkpoint-dir "$tmp/full_fs" --out "$tmp/full_out" >/dev/null 2>"$tmp/e"; rc=$?
  echo "    checkpoint on a full disk -> exit $rc: $(cat "$tmp/e")"
  save_fails "checkpoint on a full disk" "No space left on device" "$tmp/full_fs"
  umount "$tmp/full_fs"
else
  echo "  SKIP  checkpoint on a full disk (mounting a small tmpfs needs root)"
fi

[ $fail -eq 0 ] && echo "syncbn-train checks passed" || echo "FAILED"
exit $fail
