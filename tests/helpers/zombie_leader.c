/* A process that outlives its parent while looking dead: it forks a
 * helper whose main thread calls pthread_exit() while a second thread
 * keeps appending a tick to the file named by argv[1] every 0.1 s. The
 * helper shows as state 'Z' (its leader exited) yet runs on, and waitpid()
 * cannot reap it while its other thread lives. The command itself exits 0
 * after 0.3 s. (A review found the launcher's reaper skipped 'Z' processes
 * and so left this one running after its run was recorded ended.) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static const char *path;

static void *tick(void *unused) {
    (void)unused;
    for (int i = 0; i < 600; i++) {
        FILE *f = fopen(path, "a");
        if (f) {
            fprintf(f, "%d\n", i);
            fclose(f);
        }
        usleep(100000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: zombie_leader TICKFILE\n");
        return 2;
    }
    path = argv[1];
    if (fork() == 0) {
        pthread_t t;
        pthread_create(&t, NULL, tick, NULL);
        pthread_exit(NULL);
    }
    usleep(300000);
    return 0;
}
