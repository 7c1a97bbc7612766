/* shown.h: bytes from a file as a message shows them. A file can be anyone's, and a
 * control byte must not reach the terminal (ESC and the C1 controls can move the cursor,
 * retitle the window, worse on some terminals): printable ASCII and whole UTF-8
 * characters past the C1 controls are kept, every other byte (a backslash included)
 * becomes \xNN. Compiled into libcavs (the data loaders, the vectors reader) and into
 * the cavs driver (parameter files, cavs plot's log, --init's words), so both quote a
 * file by the one rule. */
#ifndef CV_SHOWN_H
#define CV_SHOWN_H

#include <stddef.h>
#include <string.h>

/* The length of the UTF-8 sequence at s[0..n), n > 0: 1 to 4, or 0 where it is not one
   (a stray continuation byte, a sequence cut short, an overlong form, a surrogate, a
   code point above U+10FFFF). */
size_t cv_utf8_len(const unsigned char *s, size_t n);

/* At most `max` bytes of p[0..n) so shown into out (room for 4 * max + 4 bytes), "..."
   after them where there were more. Returns out. */
const char *cv_quote(char *out, const char *p, size_t n, size_t max);

/* cv_quote of CV_SHOWN_BYTES, the messages' length */
enum { CV_SHOWN_BYTES = 40, CV_SHOWN = 4 * CV_SHOWN_BYTES + 4 };
const char *cv_shown(char out[CV_SHOWN], const char *p, size_t n);
/* a string so shown, in a buffer that lives to the end of the enclosing block */
#define CV_SHOW(str) cv_shown((char[CV_SHOWN]){0}, (str), strlen(str))

#endif
