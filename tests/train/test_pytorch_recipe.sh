#!/usr/bin/env bash
# The README's PyTorch recipe, run as written: syncbn-train trains briefly
# (SyncBN over 2 thread ranks) and writes its model file; the recipe (the
# Python block after the "tested by tests/train/test_pytorch_recipe.sh"
# marker in README.md) defines the network in PyTorch and loads that file
# with load_state_dict(strict=True); its eval-mode outputs on 32 images must
# equal those of the C network (eval_dump) within float32 tolerance.
set -u
bin=${1:-build/tools/syncbn-train}; dump=${2:-build/tests/train/eval_dump}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
timeout -k 5 300 "$bin" --bn sync --ranks 2 --batch 8 --epochs 1 --train-size 256 --test-size 64 --quiet \
  --checkpoint-dir "$tmp/ckpt" --out "$tmp" >/dev/null || { echo "FAIL: training run"; exit 1; }
model="$tmp/ckpt/syncbn-train-syncbn.safetensors"
timeout -k 5 60 "$dump" "$model" "$tmp/eval.safetensors" 3 16 || { echo "FAIL: eval_dump"; exit 1; }
awk '/tested by tests\/train\/test_pytorch_recipe.sh/ { on = 1; next }
     on && /^```python/ { inside = 1; next } inside && /^```/ { exit } inside { print }' "$root/README.md" >"$tmp/recipe.py"
[ -s "$tmp/recipe.py" ] || { echo "FAIL: no recipe found in README.md"; exit 1; }
sed -i "s|^MODEL = .*|MODEL = \"$model\"|" "$tmp/recipe.py"
cat >>"$tmp/recipe.py" <<PY

# --- the test's comparison, appended to the recipe ---
ref = load_safetensors("$tmp/eval.safetensors")
with torch.no_grad():
    out = net(ref["x"])
err = (out - ref["logits"]).abs().max().item()
scale = ref["logits"].abs().max().item()
# float32 convolutions summed in a different order (OpenBLAS im2col vs
# PyTorch's kernels): ~1e-6 relative expected; 1e-4 allowed
tol = 1e-4 * max(1.0, scale)
print("recipe: %d state-dict keys loaded strictly; eval logits max |diff| %.3g (scale %.3g, tolerance %.3g)"
      % (len(net.state_dict()), err, scale, tol))
print("recipe: predicted classes equal: %s" % bool((out.argmax(1) == ref["logits"].argmax(1)).all()))
raise SystemExit(0 if err <= tol else 1)
PY
timeout -k 5 120 /usr/bin/python3 "$tmp/recipe.py"
