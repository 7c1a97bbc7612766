/* shown.c: bytes from a file as a message shows them (shown.h). */
#include "shown.h"

#include <stdbool.h>
#include <stdio.h>

size_t cv_utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t k = c < 0x80 ? 1 : (c >= 0xc2 && c <= 0xdf) ? 2 : (c >= 0xe0 && c <= 0xef) ? 3 : (c >= 0xf0 && c <= 0xf4) ? 4 : 0;
  if (!k || k > n) return 0;
  for (size_t j = 1; j < k; j++)
    if ((s[j] & 0xc0) != 0x80) return 0;
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) || (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))
    return 0;
  return k;
}

const char *cv_quote(char *out, const char *p, size_t n, size_t max) {
  const unsigned char *s = (const unsigned char *)p;
  char *o = out;
  size_t i = 0;
  while (i < n) {
    size_t k = cv_utf8_len(s + i, n - i);
    if (i + (k ? k : 1) > max) break;
    /* kept: printable ASCII, and characters past U+009F (the C1 controls, U+0080 to
       U+009F, are two bytes from 0xc2 0x80: a terminal may act on them as on ESC) */
    bool keep = k == 1 ? s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\' : k > 1 && !(s[i] == 0xc2 && s[i + 1] < 0xa0);
    if (keep) memcpy(o, s + i, k), o += k, i += k;
    else o += sprintf(o, "\\x%02x", s[i]), i++;
  }
  strcpy(o, i < n ? "..." : "");
  return out;
}

const char *cv_shown(char out[CV_SHOWN], const char *p, size_t n) { return cv_quote(out, p, n, CV_SHOWN_BYTES); }
