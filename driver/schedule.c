/* schedule.c: the learning rate of each epoch, by the schedule a checkpoint keeps in its
 * training state (cavs.h: enum cavs_schedule), and the plateau schedule's decision after
 * an epoch. Pure functions of that state, so that a resumed run computes what the
 * uninterrupted one did, and tests/check_driver checks them against the formulas. */
#include "driver.h"

#include <math.h>
#include <string.h>

static const char *const names[] = {[CAVS_SCHED_CONSTANT] = "constant", [CAVS_SCHED_STEP] = "step",
                                    [CAVS_SCHED_COSINE] = "cosine", [CAVS_SCHED_PLATEAU] = "plateau"};
_Static_assert(sizeof names / sizeof *names == CAVS_SCHED_COUNT, "one name per schedule");

int sched_kind(const char *name) {
  for (int k = 0; k < CAVS_SCHED_COUNT; k++)
    if (!strcmp(name, names[k])) return k;
  return -1;
}

const char *sched_name(int kind) { return kind >= 0 && kind < CAVS_SCHED_COUNT ? names[kind] : "?"; }

double sched_lr(const cavs_train_state *t, int epoch) {
  double lr = t->optim.lr;
  switch (t->schedule) {
  case CAVS_SCHED_STEP: {
    int step = t->lr_step > 0 ? t->lr_step : 1, start = t->lr_decay_start > 0 ? t->lr_decay_start : step;
    if (t->lr_decay > 0 && t->lr_decay < 1 && epoch > start)
      lr *= pow(t->lr_decay, (double)((epoch - 1 - start) / step + 1));
    return lr;
  }
  case CAVS_SCHED_COSINE: {
    /* PyTorch's CosineAnnealingLR stepped once an epoch, held at the floor past T */
    int T = t->cosine_epochs > 0 ? t->cosine_epochs : 1, e = epoch - 1 < T ? epoch - 1 : T;
    return t->lr_min + (lr - t->lr_min) * (1 + cos(M_PI * (double)e / (double)T)) / 2;
  }
  case CAVS_SCHED_PLATEAU: return t->lr_now > 0 ? t->lr_now : lr;
  default: return lr;
  }
}

/* PyTorch's ReduceLROnPlateau with threshold 0 and no cool-down: a metric better than
 * the best resets the count; past `patience` epochs without one the rate is cut by the
 * factor (not below the floor) and the count starts again. A metric that is not finite
 * (a dev loss that overflowed) is no better than any: it never becomes the best, which
 * a checkpoint could not hold. */
bool sched_plateau(cavs_train_state *t, double metric, bool higher) {
  if (isfinite(metric) &&
      (t->plateau_best < 0 || (higher ? metric > t->plateau_best : metric < t->plateau_best))) {
    t->plateau_best = metric;
    t->plateau_bad = 0;
    return false;
  }
  if (++t->plateau_bad <= t->plateau_patience) return false;
  t->plateau_bad = 0;
  double lr = sched_lr(t, 0), cut = lr * (t->plateau_factor > 0 ? t->plateau_factor : 0.1);
  if (cut < t->lr_min) cut = t->lr_min;
  if (!(cut < lr)) return false;
  t->lr_now = cut;
  return true;
}
