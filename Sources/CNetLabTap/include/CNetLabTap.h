#ifndef CNETLABTAP_H
#define CNETLABTAP_H

#include <stddef.h>
#include <stdint.h>
#include <poll.h>

/// Opens /dev/net/tun as a TAP device (IFF_TAP | IFF_NO_PI: whole Ethernet frames, no packet-information
/// prefix), non-blocking and close-on-exec. `requested_name` may be NULL (the kernel picks tapN); the name
/// the device got is copied into `actual_name` (at least 16 bytes). Returns the descriptor, or -errno.
int cnetlab_open_tap(const char *requested_name, char *actual_name, size_t actual_capacity);

/// poll(2) with a timeout in nanoseconds (ppoll; a negative timeout waits without end). Returns what
/// ppoll returns, with errno set on failure.
int cnetlab_poll(struct pollfd *fds, size_t count, int64_t timeout_nanoseconds);

/// Sets the calling thread's timer slack to `nanoseconds` (prctl PR_SET_TIMERSLACK): the kernel may
/// otherwise wake a sleeping thread up to 50 microseconds late. Returns 0 or -errno.
int cnetlab_set_timer_slack(unsigned long nanoseconds);

/// Moves the calling thread into the network namespace open at `fd` (setns with CLONE_NEWNET): sockets
/// it creates afterwards belong to that namespace. Returns 0 or -errno.
int cnetlab_enter_network_namespace(int fd);

#endif
