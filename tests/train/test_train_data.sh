#!/usr/bin/env bash
# syncbn-train's data as distributed:
#  - MNIST-format folders, plain and gzipped (as MNIST and Fashion-MNIST ship): the same
#    data gives the same training run bit for bit (losses, accuracies), and it learns;
#  - a truncated .gz is a clear error naming the file;
#  - CIFAR-10's python (pickle) version is recognized, with a pointer to the binary one;
#  - --data fashion-mnist without Debian's package says how to install it.
set -u
bin=${1:-build/tools/syncbn-train}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if [ "$2" -eq 0 ]; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi; }
/usr/bin/python3 "$here/make_idx.py" "$tmp/plain" "$tmp/gz" 512 200 || exit 1
run="--bn sync --ranks 2 --batch 8 --epochs 2 --width 8 --quiet"
timeout -k 5 300 "$bin" $run --data "mnist:$tmp/plain" --out "$tmp/o1" >"$tmp/o1.log" 2>&1; r1=$?
timeout -k 5 300 "$bin" $run --data "mnist:$tmp/gz" --out "$tmp/o2" >"$tmp/o2.log" 2>&1; r2=$?
head -1 "$tmp/o2.log" | sed 's/^/    | /'
paste -d' ' <(cut -d, -f1-5 "$tmp/o1/train_log.csv") <(cut -d, -f1-5 "$tmp/o2/train_log.csv") | sed 's/^/    plain | gz: /'
cmp -s <(cut -d, -f1-5 "$tmp/o1/train_log.csv") <(cut -d, -f1-5 "$tmp/o2/train_log.csv")
check "gzipped and plain IDX files train identically (exit $r1, $r2)" $(( $? || r1 || r2 ))
acc=$(awk -F, '$1 == "syncbn" { a = $5 } END { printf "%d", a * 100 }' "$tmp/o2/train_log.csv")
check "the gzipped data is read correctly: test accuracy $acc% >= 50% (chance 10%)" $(( acc < 50 ))

cp -r "$tmp/gz" "$tmp/cut"
f="$tmp/cut/train-images-idx3-ubyte.gz"; head -c 20000 "$f" >"$f.x" && mv "$f.x" "$f"
timeout -k 5 60 "$bin" $run --data "mnist:$tmp/cut" --out "$tmp/o3" >/dev/null 2>"$tmp/e"; rc=$?
echo "    truncated gz -> exit $rc: $(cat "$tmp/e")"
[ $rc -ne 0 ] && grep -q "train-images-idx3-ubyte.gz: corrupt or truncated gzip" "$tmp/e"
check "a truncated .gz is an error naming the file" $?

mkdir -p "$tmp/cifar-py" "$tmp/cifar-bin"
/usr/bin/python3 -c '
import pickle, sys
d = {b"batch_label": b"training batch 1 of 5", b"labels": [1, 2], b"data": bytes(2 * 3072), b"filenames": [b"a", b"b"]}
for name in ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]:
    pickle.dump(d, open(sys.argv[1] + "/" + name, "wb"), protocol=2)
    pickle.dump(d, open(sys.argv[2] + "/" + name + ".bin", "wb"), protocol=2)
' "$tmp/cifar-py" "$tmp/cifar-bin"
for dir in cifar-py cifar-bin; do
  timeout -k 5 60 "$bin" $run --data "cifar10:$tmp/$dir" --out "$tmp/o4" >/dev/null 2>"$tmp/e"; rc=$?
  echo "    $dir -> exit $rc: $(cat "$tmp/e")"
  [ $rc -ne 0 ] && grep -q "python" "$tmp/e" && grep -q "cifar-10-binary.tar.gz" "$tmp/e"
  check "CIFAR-10's python version ($dir) is named, with the binary version's address" $?
done

if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  timeout -k 5 60 "$bin" --data fashion-mnist --out "$tmp/o5" >/dev/null 2>"$tmp/e"; rc=$?
  echo "    fashion-mnist missing -> exit $rc: $(cat "$tmp/e")"
  [ $rc -ne 0 ] && grep -q "dataset-fashion-mnist" "$tmp/e"
  check "--data fashion-mnist without the package says how to install it" $?
else
  timeout -k 5 120 "$bin" --data fashion-mnist --bn sync --ranks 2 --batch 8 --epochs 1 --stop-after 5 --quiet \
    --out "$tmp/o5" >"$tmp/o5.log" 2>&1; rc=$?
  head -1 "$tmp/o5.log" | sed 's/^/    | /'
  grep -q "fashion-mnist data (60000 train / 10000 test images of 1x28x28)" "$tmp/o5.log"
  check "--data fashion-mnist loads Debian's 60000 + 10000 gzipped images and trains (exit $rc)" $(( $? || rc ))
fi
[ $fail -eq 0 ] && echo "syncbn-train data checks passed" || echo "FAILED"
exit $fail
