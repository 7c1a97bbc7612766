/* check_afile.c: files written whole (runtime/afile.c, compiled in), as checkpoints,
 * generated data and plots are. A writer in the middle of its save survives another
 * process saving to the same path (the earlier design removed its temporary file), and
 * of the two the last to commit wins; a killed writer's leftover is removed by the next
 * save, and no file of the user's ever is, whatever its name. Each case is run with the
 * unnamed temporary file (O_TMPFILE) and with the named fallback of filesystems without
 * it. The other writer is the `cavs` command (cavs gen), which saves as checkpoints do. */
#include "afile.h"
#include "cli.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>

static bool modes[] = {false, true}; /* O_TMPFILE, then the named fallback */

/* Temporary files of `base` in the scratch directory. */
static int temps(const char *base) {
  DIR *d = opendir(dir);
  ck_assert(d != NULL);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += cv_afile_is_temp(e->d_name, base);
  closedir(d);
  return n;
}

static void gen_into(const char *path) {
  RunResult r = cavs("gen", "toy", "--graphs", "20", "--seed", "7", "-o", path, NULL);
  ok(&r, "cavs gen");
  tu_free(&r);
}

static bool starts(const char *path, const char *with) {
  char *s = tu_slurp(path, NULL);
  bool yes = s && !strncmp(s, with, strlen(with));
  free(s);
  return yes;
}

/* A save with `flags` of `what` to path: 0, or -1 with the message in err */
static int save(const char *path, int flags, const char *what, char *err, size_t errlen) {
  cv_afile a;
  if (cv_afile_open(&a, path, flags, err, errlen) || cv_afile_write(&a, what, strlen(what), err, errlen)) return -1;
  return cv_afile_commit(&a, err, errlen);
}

/* fsync(2) as the C library's (afile.c, compiled in, calls this one), but failing with
 * dir_fsync_errno for a directory while that is set: a disk that did not take the
 * directory's block after the rename. */
static int dir_fsync_errno;
int fsync(int fd) {
  struct stat st;
  if (dir_fsync_errno && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    errno = dir_fsync_errno;
    return -1;
  }
  return (int)syscall(SYS_fsync, fd);
}

static bool is_link(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

/* Another process saves to the path while a save is half written: both finish, the one
 * that commits last is what the path holds. */
START_TEST(live_writer_survives_another_save) {
  char err[512], *p = strdup(path_in("live.ckpt"));
  cv_afile a;
  ck_assert_msg(cv_afile_open(&a, p, modes[_i], err, sizeof err) == 0, "%s", err);
  ck_assert(cv_afile_write(&a, "MINE: first half, ", 18, err, sizeof err) == 0);
  ck_assert_int_eq(temps("live.ckpt"), modes[_i] ? 1 : 0); /* only the fallback has a name */
  gen_into(p); /* saves, and removes what it takes for leftovers */
  ck_assert_msg(starts(p, "("), "the other save did not land");
  ck_assert_int_eq(temps("live.ckpt"), modes[_i] ? 1 : 0);
  ck_assert(cv_afile_write(&a, "second half", 11, err, sizeof err) == 0);
  ck_assert_msg(cv_afile_commit(&a, err, sizeof err) == 0, "the first save failed: %s", err);
  ck_assert_msg(starts(p, "MINE: first half, second half"), "the last save is not what the path holds");
  ck_assert_int_eq(temps("live.ckpt"), 0);
  free(p);
}
END_TEST

/* A writer killed before its commit: the fallback's file is removed by the next save;
 * the unnamed one never had a name. The path keeps what it held. */
START_TEST(killed_writer_leaves_nothing) {
  char *p = strdup(path_in("killed.ckpt"));
  tu_write(p, "OLD", 3);
  pid_t pid = fork();
  ck_assert(pid >= 0);
  if (pid == 0) {
    char err[512];
    cv_afile a;
    if (cv_afile_open(&a, p, modes[_i], err, sizeof err) || cv_afile_write(&a, "NEW, unfinished", 15, err, sizeof err))
      _exit(1);
    raise(SIGKILL); /* killed before its commit (and no leak check of valgrind's to run) */
  }
  int st;
  waitpid(pid, &st, 0);
  ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the writer did not get as far as its kill: status %d", st);
  ck_assert_int_eq(temps("killed.ckpt"), modes[_i] ? 1 : 0);
  ck_assert(starts(p, "OLD"));
  gen_into(p);
  ck_assert_int_eq(temps("killed.ckpt"), 0);
  free(p);
}
END_TEST

/* Files that look like temporary files but are not provably ours and abandoned: each
 * survives a save beside it. */
START_TEST(user_files_never_removed) {
  char *p = strdup(path_in("notes.ckpt"));
  static const char *const names[] = {
      "notes.ckpt.tmpbackup", /* the earlier design's pattern, a user's file */
      "notes.ckpt.tmpAbC123",
      ".notes.ckpt.cavs-tmp-0123456789abcdef", /* the right shape, not the right check */
      ".notes.ckpt.cavs-tmp-0123456789ab",
      "notes.ckpt.cavs-tmp-0123456789abcdef",
  };
  enum { N = sizeof names / sizeof *names };
  for (int i = 0; i < N; i++) tu_write(path_in(names[i]), "the user's", 10);
  /* a real temporary name, held by a file with a second link (the user's hard link),
     and one that is a symbolic link: not removed either */
  char err[512];
  cv_afile a;
  ck_assert(cv_afile_open(&a, p, true, err, sizeof err) == 0);
  char *t1 = strdup(path_in(a.tmp)), *t2 = NULL;
  cv_afile_abort(&a);
  tu_write(path_in("kept"), "the user's", 10);
  ck_assert(link(path_in("kept"), t1) == 0);
  ck_assert(cv_afile_open(&a, p, true, err, sizeof err) == 0);
  t2 = strdup(path_in(a.tmp));
  cv_afile_abort(&a);
  ck_assert(symlink(path_in("kept"), t2) == 0);
  ck_assert_int_eq(temps("notes.ckpt"), 2);
  gen_into(p);
  for (int i = 0; i < N; i++) ck_assert_msg(starts(path_in(names[i]), "the user's"), "%s was removed", names[i]);
  ck_assert_msg(starts(t1, "the user's"), "a temporary name with two links was removed");
  struct stat st;
  ck_assert_msg(lstat(t2, &st) == 0 && S_ISLNK(st.st_mode), "a symbolic link was removed");
  ck_assert(starts(path_in("kept"), "the user's"));
  unlink(t1);
  unlink(t2);
  free(t1);
  free(t2);
  free(p);
}
END_TEST

/* The temporary names check themselves: one changed digit, or another base, is not one
 * (fixed names: a 16-bit check misses a random change once in 65,536). */
/* A path a user gave (CV_AFILE_USER): its links followed, the file they lead to replaced
 * and the links kept (and a link that leads to nothing yet made to lead to the new
 * file); the replaced file's permissions kept; a FIFO written straight to; a socket or a
 * directory refused. Without USER (the cache's own files) a link is replaced, and what
 * it led to is left. */
static void remove_user_paths(void) {
  const char *names[] = {"real.ckpt", "link.ckpt", "to.ckpt", "sub/hop", "sub/made.ckpt", "sub", "pipe", "sock"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) remove(path_in(names[i]));
}

START_TEST(user_paths_followed_and_kept) {
  int f = (modes[_i] ? CV_AFILE_NAMED : 0) | CV_AFILE_USER;
  remove_user_paths(); /* (what a failed case left) */
  char err[512];
  mode_t mask = umask(022);
  char *real = strdup(path_in("real.ckpt")), *link = strdup(path_in("link.ckpt"));
  tu_write(real, "old", 3);
  ck_assert(chmod(real, 0600) == 0);
  ck_assert(symlink("real.ckpt", link) == 0);
  ck_assert_msg(save(link, f, "new", err, sizeof err) == 0, "%s", err);
  ck_assert_msg(is_link(link) && starts(real, "new"), "the link was replaced, or its file not written");
  struct stat st;
  ck_assert(stat(real, &st) == 0);
  ck_assert_int_eq(st.st_mode & 0777, 0600);
  ck_assert_int_eq(temps("real.ckpt") + temps("link.ckpt"), 0);
  /* a link to a file to be made (through a second link, relative to each one's place) */
  char *sub = strdup(path_in("sub")), *to = strdup(path_in("to.ckpt"));
  ck_assert(mkdir(sub, 0700) == 0);
  ck_assert(symlink("sub/hop", to) == 0);
  ck_assert(symlink("made.ckpt", path_in("sub/hop")) == 0);
  ck_assert_msg(save(to, f, "made", err, sizeof err) == 0, "%s", err);
  ck_assert(is_link(to) && is_link(path_in("sub/hop")) && starts(path_in("sub/made.ckpt"), "made"));
  ck_assert(stat(path_in("sub/made.ckpt"), &st) == 0);
  ck_assert_int_eq(st.st_mode & 0777, 0644); /* (a new file: the umask's) */
  /* without USER: the link itself replaced, its file left */
  ck_assert_msg(save(link, f & ~CV_AFILE_USER, "own", err, sizeof err) == 0, "%s", err);
  ck_assert(!is_link(link) && starts(link, "own") && starts(real, "new"));
  /* a FIFO: written to as it is (a reader waiting), still a FIFO after */
  char *fifo = strdup(path_in("pipe"));
  ck_assert(mkfifo(fifo, 0600) == 0);
  int rd = open(fifo, O_RDONLY | O_NONBLOCK);
  ck_assert(rd >= 0);
  ck_assert_msg(save(fifo, f, "piped", err, sizeof err) == 0, "%s", err);
  char buf[16] = "";
  ck_assert_int_eq(read(rd, buf, sizeof buf - 1), 5);
  ck_assert_str_eq(buf, "piped");
  close(rd);
  ck_assert(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
  /* a socket (where the scratch directory's path fits one's address) and a directory:
     refused, left as they were */
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path_in("sock")) < sizeof sa.sun_path) {
    int so = socket(AF_UNIX, SOCK_STREAM, 0);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path_in("sock"));
    ck_assert(so >= 0 && bind(so, (struct sockaddr *)&sa, sizeof sa) == 0);
    ck_assert(save(path_in("sock"), f, "x", err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "not a regular file (a socket)"), "%s", err);
    close(so);
    ck_assert(stat(path_in("sock"), &st) == 0 && S_ISSOCK(st.st_mode));
  }
  ck_assert(save(sub, f, "x", err, sizeof err) == -1);
  ck_assert_msg(strstr(err, "it is a directory"), "%s", err);
  /* the command through a link: the file it leads to written */
  unlink(link);
  ck_assert(symlink("real.ckpt", link) == 0);
  gen_into(link);
  ck_assert(is_link(link) && starts(real, "("));
  umask(mask);
  remove_user_paths();
  free(real), free(link), free(sub), free(to), free(fifo);
}
END_TEST

/* A descriptor the process holds, named as the shell names it: written to through a
 * duplicate (the shell's file appended to, the same file after), never replaced. */
START_TEST(descriptors_written_to) {
  int f = (modes[_i] ? CV_AFILE_NAMED : 0) | CV_AFILE_USER;
  char err[512], name[64];
  const char *file = path_in("held.txt");
  tu_write(file, "old\n", 4);
  int fd = open(file, O_WRONLY | O_APPEND);
  ck_assert(fd >= 0);
  struct stat before, after;
  ck_assert(fstat(fd, &before) == 0);
  const char *forms[] = {"/dev/fd/%d", "/proc/self/fd/%d"};
  for (int k = 0; k < 2; k++) {
    snprintf(name, sizeof name, forms[k], fd);
    ck_assert_int_eq(cv_afile_descriptor(name), fd);
    ck_assert_msg(save(name, f, k ? "b\n" : "a\n", err, sizeof err) == 0, "%s", err);
  }
  ck_assert_int_eq(cv_afile_descriptor("/dev/stdout"), 1);
  ck_assert_int_eq(cv_afile_descriptor("/dev/fd/"), -1);
  ck_assert_int_eq(cv_afile_descriptor("/dev/fd/99999"), -1); /* (not open) */
  ck_assert_int_eq(cv_afile_descriptor(file), -1);
  ck_assert(stat(file, &after) == 0 && after.st_ino == before.st_ino);
  char *text = tu_slurp(file, NULL);
  ck_assert_msg(text && !strcmp(text, "old\na\nb\n"), "%s", text ? text : "(none)");
  free(text);
  close(fd);
  remove(file);
}
END_TEST

/* A file this process may not write is not replaced (its directory would let a rename
 * by): as root, in a child that has given up root for nobody, in a directory nobody
 * may write into, with nobody's read-only file. */
START_TEST(write_protected_refused) {
  const char *file = path_in("ro.txt");
  remove(file);
  tu_write(file, "kept\n", 5);
  bool root = geteuid() == 0;
  if (root) ck_assert(chown(dir, 65534, 65534) == 0 && chown(file, 65534, 65534) == 0);
  ck_assert(chmod(file, 0444) == 0);
  pid_t pid = fork();
  ck_assert(pid >= 0);
  if (pid == 0) {
    if (root && (setgid(65534) || setuid(65534))) _exit(3);
    char err[512], *target;
    bool direct;
    int rc = save(file, CV_AFILE_USER, "new", err, sizeof err);
    if (rc != -1 || !strstr(err, "it is write-protected")) _exit(4);
    if (cv_afile_target(file, &target, &direct, err, sizeof err) != -1) _exit(5);
    if (save(file, 0, "own", err, sizeof err)) _exit(6); /* (without USER: cavs's own files) */
    _exit(0);
  }
  int status;
  ck_assert(waitpid(pid, &status, 0) == pid);
  if (root) ck_assert(chown(dir, 0, 0) == 0);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d", status);
  char *text = tu_slurp(file, NULL);
  ck_assert_msg(text && !strcmp(text, "own"), "%s", text ? text : "(none)");
  free(text);
  remove(file);
}
END_TEST

START_TEST(temporary_names_check_themselves) {
  char err[512], name[300];
  cv_afile a;
  ck_assert(cv_afile_open(&a, path_in("n.ckpt"), true, err, sizeof err) == 0);
  ck_assert(cv_afile_is_temp(a.tmp, "n.ckpt"));
  cv_afile_abort(&a);
  cv_afile_temp_name("n.ckpt", 0x0123456789abull, name, sizeof name);
  ck_assert_msg(!strncmp(name, ".n.ckpt.cavs-tmp-0123456789ab", 29) && strlen(name) == 33, "%s", name);
  ck_assert(cv_afile_is_temp(name, "n.ckpt"));
  ck_assert(!cv_afile_is_temp(name, "m.ckpt"));
  ck_assert(!cv_afile_is_temp(name, "n.ckp"));
  for (size_t i = strlen(name) - 16; i < strlen(name); i++) {
    char c = name[i];
    name[i] = c == '0' ? '1' : '0';
    ck_assert_msg(!cv_afile_is_temp(name, "n.ckpt"), "%s passes", name);
    name[i] = c == 'a' ? 'A' : c; /* and no capitals */
    ck_assert(cv_afile_is_temp(name, "n.ckpt") == (c != 'a'));
    name[i] = c;
  }
  /* a base too long for a name of its own is cut, and still checked */
  char base[256];
  memset(base, 'b', 250);
  base[250] = 0;
  ck_assert(cv_afile_open(&a, path_in(base), true, err, sizeof err) == 0);
  ck_assert(cv_afile_is_temp(a.tmp, base));
  ck_assert(cv_afile_write(&a, "x", 1, err, sizeof err) == 0);
  ck_assert_msg(cv_afile_commit(&a, err, sizeof err) == 0, "%s", err);
  ck_assert(starts(path_in(base), "x"));
}
END_TEST

/* Eight processes commit 40 saves each to one path at once: every save succeeds, and the
 * path always holds one of them whole. */
START_TEST(concurrent_commits_all_finish) {
  char *p = strdup(path_in("many.ckpt"));
  enum { PROCS = 8, SAVES = 40, SIZE = 1 << 16 };
  pid_t pids[PROCS];
  for (int k = 0; k < PROCS; k++) {
    pids[k] = fork();
    ck_assert(pids[k] >= 0);
    if (pids[k] == 0) {
      static char buf[SIZE];
      memset(buf, 'a' + k, sizeof buf);
      for (int s = 0; s < SAVES; s++) {
        char err[512];
        cv_afile a;
        if (cv_afile_open(&a, p, modes[_i], err, sizeof err) || cv_afile_write(&a, buf, SIZE / 2, err, sizeof err) ||
            cv_afile_write(&a, buf, SIZE / 2, err, sizeof err) || cv_afile_commit(&a, err, sizeof err)) {
          fprintf(stderr, "writer %d, save %d: %s\n", k, s, err);
          _exit(1);
        }
        /* the path is whole at every moment: one writer's bytes, all of them */
        size_t n;
        char *got = tu_slurp(p, &n);
        if (!got || n != SIZE || (size_t)strspn(got, (char[]){got[0], 0}) != n) _exit(2);
        free(got);
      }
      free(p); /* the child's heap is checked for leaks too (valgrind) */
      _exit(0);
    }
  }
  for (int k = 0; k < PROCS; k++) {
    int st;
    waitpid(pids[k], &st, 0);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %d: status %d", k, st);
  }
  ck_assert_int_eq(temps("many.ckpt"), 0);
  free(p);
}
END_TEST

/* The rename flushed: where the directory's flush fails the save reports it (the new
 * file in place, nothing temporary left), as a save that failed, not one that was done;
 * a filesystem that cannot flush a directory (EINVAL) is not an error. */
START_TEST(unflushed_directory_reported) {
  char path[PATH_MAX], err[512];
  snprintf(path, sizeof path, "%s/flushed.txt", dir);
  ck_assert_msg(save(path, modes[_i] ? CV_AFILE_NAMED : 0, "old\n", err, sizeof err) == 0, "%s", err);
  dir_fsync_errno = EIO;
  int rc = save(path, modes[_i] ? CV_AFILE_NAMED : 0, "new\n", err, sizeof err);
  dir_fsync_errno = 0;
  ck_assert_msg(rc == -1, "a save whose directory was not flushed said it was done");
  ck_assert_msg(strstr(err, "flushed.txt") && strstr(err, "could not be flushed") && strstr(err, strerror(EIO)), "%s",
                err);
  ck_assert_msg(starts(path, "new\n"), "the renamed file is not in place");
  ck_assert_int_eq(temps("flushed.txt"), 0);
  dir_fsync_errno = EINVAL;
  rc = save(path, modes[_i] ? CV_AFILE_NAMED : 0, "newer\n", err, sizeof err);
  dir_fsync_errno = 0;
  ck_assert_msg(rc == 0, "EINVAL from a directory's flush: %s", err);
  ck_assert_msg(starts(path, "newer\n"), "the third save is not in place");
  unlink(path);
}
END_TEST

int main(void) {
  if (cli_init("afile")) return 99;
  Suite *s = suite_create("afile");
  TCase *tc = tcase_create("afile");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, live_writer_survives_another_save, 0, 2);
  tcase_add_loop_test(tc, killed_writer_leaves_nothing, 0, 2);
  tcase_add_test(tc, user_files_never_removed);
  tcase_add_test(tc, temporary_names_check_themselves);
  tcase_add_loop_test(tc, descriptors_written_to, 0, 2);
  tcase_add_test(tc, write_protected_refused);
  tcase_add_loop_test(tc, user_paths_followed_and_kept, 0, 2);
  tcase_add_loop_test(tc, concurrent_commits_all_finish, 0, 2);
  tcase_add_loop_test(tc, unflushed_directory_reported, 0, 2);
  suite_add_tcase(s, tc);
  return tu_run_suite_shared(s, dir);
}
