/* Run a command as if the kernel had no Landlock, or an older one: the
 * allowed stand-in for "a kernel without Landlock or below the floor"
 * (TESTING.md). The filter is inherited by everything the command starts
 * (an sshd and every far session under it).
 *
 *     no_landlock CMD [ARGS...]
 *         a seccomp filter answers the three Landlock system calls with
 *         ENOSYS, the errno of a kernel built without it.
 *
 *     no_landlock --abi N CMD [ARGS...]
 *         a kernel at Landlock ABI N: the version query
 *         landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
 *         returns N. Every other landlock_create_ruleset call fails with
 *         EOPNOTSUPP (nothing that is not really ABI N is ever created). A
 *         seccomp filter cannot return a positive value itself, so the call
 *         goes to a user-notification listener: a child of this process
 *         answers it, and dies with it (PR_SET_PDEATHSIG) — with the command,
 *         since the command is exec'd in this process.
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#endif
#ifndef __NR_landlock_add_rule
#define __NR_landlock_add_rule 445
#endif
#ifndef __NR_landlock_restrict_self
#define __NR_landlock_restrict_self 446
#endif
#define CREATE_RULESET_VERSION 1UL

static int install(struct sock_filter *filter, unsigned short len, unsigned int flags) {
    struct sock_fprog prog = {.len = len, .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        perror("no_landlock: prctl(NO_NEW_PRIVS)");
        return -1;
    }
    int fd = (int)syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
    if (fd < 0) {
        perror("no_landlock: seccomp(SET_MODE_FILTER)");
        return -1;
    }
    return fd;
}

/* Answers every notification on `fd` until the listener or this process goes. */
static void serve(int fd, long abi) {
    for (;;) {
        struct seccomp_notif req;
        struct seccomp_notif_resp resp;
        memset(&req, 0, sizeof req);
        if (ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
            if (errno == EINTR || errno == ENOENT)
                continue;
            _exit(0);
        }
        memset(&resp, 0, sizeof resp);
        resp.id = req.id;
        if (req.data.nr == __NR_landlock_create_ruleset && req.data.args[0] == 0 &&
            req.data.args[1] == 0 && req.data.args[2] == CREATE_RULESET_VERSION) {
            resp.val = abi;
        } else {
            resp.error = -EOPNOTSUPP;
        }
        /* ENOENT: the caller died meanwhile; nothing to answer. */
        (void)ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, &resp);
    }
}

int main(int argc, char **argv) {
    long abi = -1;
    int first = 1;
    if (argc > 2 && strcmp(argv[1], "--abi") == 0) {
        char *end = NULL;
        abi = strtol(argv[2], &end, 10);
        if (end == argv[2] || *end != '\0' || abi < 1) {
            fprintf(stderr, "no_landlock: --abi wants a positive integer\n");
            return 2;
        }
        first = 3;
    }
    if (argc <= first) {
        fprintf(stderr, "usage: no_landlock [--abi N] CMD [ARGS...]\n");
        return 2;
    }
    if (abi < 0) {
        struct sock_filter filter[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_landlock_create_ruleset, 3, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_landlock_add_rule, 2, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_landlock_restrict_self, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
        };
        if (install(filter, (unsigned short)(sizeof filter / sizeof filter[0]), 0) < 0)
            return 1;
    } else {
        struct sock_filter filter[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_landlock_create_ruleset, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        int fd = install(filter, (unsigned short)(sizeof filter / sizeof filter[0]),
                         SECCOMP_FILTER_FLAG_NEW_LISTENER);
        if (fd < 0)
            return 1;
        pid_t parent = getpid();
        pid_t child = fork();
        if (child < 0) {
            perror("no_landlock: fork");
            return 1;
        }
        if (child == 0) {
            if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != parent)
                _exit(0);
            serve(fd, abi);
            _exit(0);
        }
        close(fd);
    }
    execvp(argv[first], argv + first);
    perror("no_landlock: execvp");
    return 127;
}
