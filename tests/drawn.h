/* drawn.h: two models whose values are drawn while training, which no example has, for
 * the suites that hold the cuda backend to the cpu's (check_cuda_emu on the emulator,
 * check_gpu on a real GPU): the draws are keyed by the seed, the step, each row's
 * vertex, the call and the column (cavs_abi.h), so both backends draw the same ones.
 *   - mixdrop: two vertex types at random, a dropout in one and one in the push block
 *     (as check_engine's dropout_masks);
 *   - noisy: Shazeer et al.'s noisy gate in front of a mixture of experts, and a noise
 *     in the push block. */
#ifndef DRAWN_H
#define DRAWN_H

static const char *const drop_src =
    "model mixdrop; dim H = 4; dim C = 3; input y : class[C]; input f : real[H];\n"
    "param Wa[2H,H], Wb[2H,H], Wc[H,C] init uniform(-1, 1);\n"
    "vertex a (children 2) { h = dropout(tanh(f + concat(gather(0), gather(1)) @ Wa), 0.5); scatter(h); push(h); }\n"
    "vertex b (children 2) { u = concat(gather(0), gather(1)) @ Wb; h = sigmoid(f * u) - 0.5; scatter(h); push(h); }\n"
    "push (p) { loss softmax_xent(dropout(p, 0.2) @ Wc, y); }\n";

static const char *const noise_src =
    "model noisy; dim H = 4; dim C = 3; dim X = 4; dim F = 3; dim HF = H * F; dim FH = F * H;\n"
    "input y : class[C]; input f : real[H];\n"
    "param W[2H,H], Wg[H,X], Wn[H,X], W1[X,HF], W2[X,FH], Wc[H,C] init uniform(-1, 1);\n"
    "vertex v (children 2) {\n  h = tanh(f + concat(gather(0), gather(1)) @ W);\n"
    "  m = moe(e in top(h @ Wg + noise(log(1 + exp(h @ Wn))), 2): relu(h @ W1[e]) @ W2[e]);\n"
    "  scatter(tanh(h + m)); push(h + m);\n}\n"
    "push (p) { loss softmax_xent((p + noise(p) * 0.1) @ Wc, y); }\n";

#endif
