/* Sandbox ("pause") process for the real-node tests' containerd: holds the pod's namespaces,
 * reaps orphans when it is PID 1 of a shared PID namespace, and exits on SIGINT/SIGTERM. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
