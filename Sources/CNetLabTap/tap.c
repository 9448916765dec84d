#define _GNU_SOURCE
#include "CNetLabTap.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <sched.h>
#include <linux/if_tun.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

int cnetlab_open_tap(const char *requested_name, char *actual_name, size_t actual_capacity) {
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct ifreq request;
    memset(&request, 0, sizeof request);
    request.ifr_flags = IFF_TAP | IFF_NO_PI;
    if (requested_name != NULL) strncpy(request.ifr_name, requested_name, IFNAMSIZ - 1);
    if (ioctl(fd, TUNSETIFF, &request) < 0) {
        int error = errno;
        close(fd);
        return -error;
    }
    if (actual_name != NULL && actual_capacity > 0) {
        strncpy(actual_name, request.ifr_name, actual_capacity - 1);
        actual_name[actual_capacity - 1] = '\0';
    }
    return fd;
}

int cnetlab_poll(struct pollfd *fds, size_t count, int64_t timeout_nanoseconds) {
    if (timeout_nanoseconds < 0) return ppoll(fds, (nfds_t)count, NULL, NULL);
    struct timespec timeout = {
        .tv_sec = (time_t)(timeout_nanoseconds / 1000000000),
        .tv_nsec = (long)(timeout_nanoseconds % 1000000000),
    };
    return ppoll(fds, (nfds_t)count, &timeout, NULL);
}

int cnetlab_set_timer_slack(unsigned long nanoseconds) {
    return prctl(PR_SET_TIMERSLACK, nanoseconds, 0, 0, 0) == 0 ? 0 : -errno;
}

int cnetlab_enter_network_namespace(int fd) {
    return setns(fd, CLONE_NEWNET) == 0 ? 0 : -errno;
}
