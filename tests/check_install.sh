#!/bin/sh
# check_install.sh: cavs as an application developer meets it. `make install` into a
# scratch DESTDIR, bash completion included (bash sources it); a model compiled by the
# installed cavsc; tests/install_app.c built against the installed libcavs with
# `pkg-config --cflags --libs cavs` alone (no path into the source or build tree),
# trained, saved and loaded back; then the installed `cavs info` reads the checkpoint
# it saved.
set -e
top=${TOP_SRCDIR:-.}
build=${BUILDDIR:-.}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cavs-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
if ! ${MAKE:-make} -s -C "$build" install DESTDIR="$root" >"$tmp/install.log" 2>&1; then
  cat "$tmp/install.log"
  exit 1
fi
prefix=$(sed -n 's/^prefix=//p' "$build/cavs.pc")
pc=$(find "$root" -name cavs.pc | head -n 1)
[ -n "$pc" ] || { echo "check_install: make install put no cavs.pc under $root"; exit 1; }
for f in "$root$prefix/bin/cavsc" "$root$prefix/bin/cavs" "$root$prefix/include/cavs.h" \
  "$root$prefix/include/cavs_abi.h" "$root$prefix/share/doc/cavs/LICENSE"; do
  [ -f "$f" ] || { echo "check_install: $f was not installed"; exit 1; }
done
# bash completion, where bash-completion looks for it, and bash takes it
comp=$root$prefix/share/bash-completion/completions/cavs
[ -f "$comp" ] || { echo "check_install: $comp was not installed"; exit 1; }
cmp -s "$comp" "$top/driver/cavs.bash" || { echo "check_install: $comp is not driver/cavs.bash"; exit 1; }
spec=$(bash -c '. "$1" && complete -p cavs' sh "$comp") || { echo "check_install: bash cannot source $comp"; exit 1; }
[ "$spec" = "complete -o default -F _cavs cavs" ] || { echo "check_install: complete -p cavs says: $spec"; exit 1; }
# the example models the manual pages name, each compiled by the installed cavsc
for m in treelstm treefc lstm_lm lstm_lm2 treegru twotype tagger tagger_chars childsum lattice_lstm lattice_gru seq2seq mvrnn nary_treelstm moe_lm moe_tree; do
  f=$root$prefix/share/cavs/$m.vf
  [ -f "$f" ] || { echo "check_install: $f was not installed"; exit 1; }
  cmp -s "$f" "$top/dsl-examples/$m.vf" || { echo "check_install: $f is not dsl-examples/$m.vf"; exit 1; }
  "$root$prefix/bin/cavsc" -o "$tmp/examples" "$f" || { echo "check_install: the installed cavsc fails on $f"; exit 1; }
done
PKG_CONFIG_PATH=$(dirname "$pc")
PKG_CONFIG_SYSROOT_DIR=$root
export PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
flags=$(pkg-config --cflags --libs cavs)
libdir=$(dirname "$(dirname "$pc")")
mkdir "$tmp/app"
cat >"$tmp/app.vf" <<'VF'
model app;
dim H = 16; dim C = 2; dim V = 10;
input word : index[V];
input label : class[C];
param emb[V,H] init uniform(-0.1, 0.1);
param W[2H,H], b[H];
param Wc[H,C];
pull { x = emb[word]; }
vertex node (children 2) {
  h = tanh(pull() + concat(gather(0), gather(1)) @ W + b);
  scatter(h);
  push(h);
}
push (h) { loss softmax_xent(h @ Wc, label); }
VF
"$root$prefix/bin/cavsc" -o "$tmp/app" "$tmp/app.vf"
# shellcheck disable=SC2086 # the flags are words
${CC:-cc} -std=c11 $SAN_CFLAGS -I"$tmp/app" -o "$tmp/app/install_app" "$top/tests/install_app.c" "$tmp/app/app.c" \
  $flags -lm -Wl,-rpath,"$libdir"
"$tmp/app/install_app" "$tmp/app.ckpt"
LD_LIBRARY_PATH=$libdir "$root$prefix/bin/cavs" info "$tmp/app.ckpt" >"$tmp/info.txt"
grep -q "^model  *app (" "$tmp/info.txt" || { echo "check_install: cavs info says:"; cat "$tmp/info.txt"; exit 1; }
# the checkpoint carries the model's source (the descriptor's): the installed cavs eval
# rebuilds the model from it, with no .vf beside it, on two trees in the cgf format (word
# ids as they are: the application's checkpoint has no vocabulary). It finds cavsc and
# the headers beside itself (PREFIX/bin, PREFIX/include), not where the build said the
# prefix would be: under DESTDIR they are not there, as after a reconfigure with
# another --prefix they would not be.
rm -f "$tmp/app.vf"
printf 'graph
0 node ; word=3 label=1
1 node ; word=6 label=1
2 node 0 1 ; label=1
end
graph
0 node ; word=4 label=0
1 node ; word=7 label=0
2 node 0 1 ; label=0
end
' >"$tmp/two.cgf"
CAVS_CACHE=$tmp/cache CAVS_INCLUDE= CAVSC= LD_LIBRARY_PATH=$libdir "$root$prefix/bin/cavs" eval "$tmp/app.ckpt" \
  --data "$tmp/two.cgf" --format cgf >"$tmp/eval.txt" 2>&1 ||
  { echo "check_install: cavs eval on the application's checkpoint:"; cat "$tmp/eval.txt"; exit 1; }
grep -q "accuracy" "$tmp/eval.txt" || { echo "check_install: cavs eval says:"; cat "$tmp/eval.txt"; exit 1; }
