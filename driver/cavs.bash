# cavs.bash: bash completion for cavs(1), installed by `make install` as
# $(datadir)/bash-completion/completions/cavs. Completes the commands, each command's
# options, the choices of an option that has them, gen's kinds and help's commands;
# anything else (a file, a checkpoint) falls back to bash's own file name completion.
# The lists below are driver/options.def's, a line a command: tests/check_docs fails
# when one of them differs from that table.

_cavs() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
  local commands='train eval predict gen info export plot build cache help' opts= choices=
  if ((COMP_CWORD == 1)); then
    COMPREPLY=($(compgen -W "$commands --help --version" -- "$cur"))
    return
  fi
  case ${COMP_WORDS[1]} in
  train) opts='--help --format --train --dev --grad-overlap --expert-parallel --no-expert-replicas --stream --epochs --batch --bptt-state --bptt-vary --optimizer --lr --momentum --clip --weight-decay --seed --dim --dropout --option --save --save-every --resume --schedule --lr-decay --lr-step --lr-decay-start --lr-min --cosine-epochs --plateau-factor --plateau-patience --warmup --patience --select --init --init-all --freeze --threads --device --one-stream --cuda-graphs --blas --policy --no-eager --no-lazy --no-views --no-dedup --no-fuse --no-merge --no-homes --no-push-view --max-memory --log --quiet --precision' ;;
  eval) opts='--help --format --data --stream --model --batch --bptt-state --threads --device --one-stream --cuda-graphs --blas --policy --no-eager --no-lazy --no-views --no-dedup --no-fuse --no-merge --no-homes --no-push-view --max-memory --json --binary' ;;
  predict) opts='--help --format --data --model --batch --threads --device --one-stream --cuda-graphs --blas --policy --no-eager --no-lazy --no-views --no-dedup --no-fuse --no-merge --no-homes --no-push-view --max-memory --all-nodes --vectors --probs --value --greedy --stop --max-steps' ;;
  gen) opts='--help --graphs --leaves --vertices --words --classes --arity --seed --dag --chars --output' ;;
  info) opts='--help' ;;
  export) opts='--help --model --output' ;;
  plot) opts='--help --output' ;;
  build) opts='--help --no-fuse --no-merge --no-homes --no-push-view --precision --target --emit-only --cached --output' ;;
  cache) opts='--help --prune --clear' ;;
  help) opts='--help' ;;
  *) return ;;
  esac
  case $prev in
  --format) choices='ptb-tree text text-bptt cgf' ;;
  --optimizer) choices='sgd adagrad adam momentum nesterov adamw' ;;
  --schedule) choices='constant step cosine plateau' ;;
  --bptt-state) choices='carry reset' ;;
  --select) choices='all root loss' ;;
  --device) choices='cpu cuda' ;;
  --policy) choices='bfs depth agenda frontier serial' ;;
  --precision) choices='float double' ;;
  --target) choices='c cuda' ;;
  esac
  if [[ -n $choices ]]; then
    COMPREPLY=($(compgen -W "$choices" -- "$cur"))
  elif [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  elif [[ ${COMP_WORDS[1]} == gen && $COMP_CWORD == 2 ]]; then
    COMPREPLY=($(compgen -W 'toy nary complete random tagger lattice translation' -- "$cur"))
  elif [[ ${COMP_WORDS[1]} == help && $COMP_CWORD == 2 ]]; then
    COMPREPLY=($(compgen -W "$commands" -- "$cur"))
  fi
}
complete -o default -F _cavs cavs
