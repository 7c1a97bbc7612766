/* cpu_name.h: the processor as bench/cpu names it, for bench/ programs that print it on
 * every line they write (bench/epoch.c, bench/steps.c). */
#ifndef BENCH_CPU_NAME_H
#define BENCH_CPU_NAME_H
#include <stdio.h>
#include <string.h>

/* "AuthenticAMD family 25 model 17 (AMD EPYC)": what bench/cpu prints, from
   /proc/cpuinfo */
static inline void cpu_name(char *out, size_t n) {
  char vendor[64] = "?", family[16] = "?", model[16] = "?", name[128] = "?", line[512];
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (!colon) continue;
    char *v = colon + 1 + (colon[1] == ' ');
    v[strcspn(v, "\n")] = 0;
    if (!strncmp(line, "vendor_id", 9) && *vendor == '?') snprintf(vendor, sizeof vendor, "%s", v);
    else if (!strncmp(line, "cpu family", 10) && *family == '?') snprintf(family, sizeof family, "%s", v);
    else if (!strncmp(line, "model\t", 6) && *model == '?') snprintf(model, sizeof model, "%s", v);
    else if (!strncmp(line, "model name", 10) && *name == '?') snprintf(name, sizeof name, "%s", v);
  }
  if (f) fclose(f);
  snprintf(out, n, "%s family %s model %s (%s)", vendor, family, model, name);
}

#endif
