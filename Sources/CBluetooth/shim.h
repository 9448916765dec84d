#ifndef THALI_CBLUETOOTH_SHIM_H
#define THALI_CBLUETOOTH_SHIM_H
#include <sys/socket.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <sys/ioctl.h>
#include <bluetooth/bluetooth.h>
#include <bluetooth/hci.h>
#include <bluetooth/rfcomm.h>

/* RFCOMM helpers: BlueZ spells these with macros (AF_BLUETOOTH, BTPROTO_RFCOMM, BDADDR_ANY) that
   Swift does not import cleanly; each returns what the system call returns (-1 and errno on failure).
   Addresses are passed least significant octet first, as in bdaddr_t. */

static inline int thali_rfcomm_socket(void) {
    return socket(AF_BLUETOOTH, SOCK_STREAM | SOCK_CLOEXEC, BTPROTO_RFCOMM);
}

static inline int thali_rfcomm_connect(int fd, const uint8_t address_le[6], uint8_t channel) {
    struct sockaddr_rc addr;
    memset(&addr, 0, sizeof(addr));
    addr.rc_family = AF_BLUETOOTH;
    memcpy(addr.rc_bdaddr.b, address_le, 6);
    addr.rc_channel = channel;
    return connect(fd, (struct sockaddr *)&addr, sizeof(addr));
}

/* Binds to one adapter's address (NULL: BDADDR_ANY, every adapter). Channel 0 on a socket that will
   connect only picks the adapter the connection leaves from. */
static inline int thali_rfcomm_bind(int fd, const uint8_t *address_le, uint8_t channel) {
    struct sockaddr_rc addr;
    memset(&addr, 0, sizeof(addr));
    addr.rc_family = AF_BLUETOOTH;
    if (address_le) memcpy(addr.rc_bdaddr.b, address_le, 6); /* all-zero rc_bdaddr is BDADDR_ANY */
    addr.rc_channel = channel;
    return bind(fd, (struct sockaddr *)&addr, sizeof(addr));
}

static inline int thali_rfcomm_accept(int fd, uint8_t address_le_out[6]) {
    struct sockaddr_rc addr;
    socklen_t length = sizeof(addr);
    memset(&addr, 0, sizeof(addr));
    int client = accept4(fd, (struct sockaddr *)&addr, &length, SOCK_CLOEXEC);
    if (client >= 0) memcpy(address_le_out, addr.rc_bdaddr.b, 6);
    return client;
}

/* Whether controller hci<dev_id> has page scan on (1: other devices can connect to it) or off (0), from
   HCIGETDEVINFO as hciconfig reads it, without privilege; -1 and errno when it cannot be told. */
static inline int thali_hci_page_scan(int dev_id) {
    int fd = socket(AF_BLUETOOTH, SOCK_RAW | SOCK_CLOEXEC, BTPROTO_HCI);
    if (fd < 0) return -1;
    struct hci_dev_info info;
    memset(&info, 0, sizeof(info));
    info.dev_id = (uint16_t)dev_id;
    int result = ioctl(fd, HCIGETDEVINFO, (void *)&info);
    int saved = errno;
    close(fd);
    if (result < 0) { errno = saved; return -1; }
    return (info.flags & (1u << HCI_PSCAN)) ? 1 : 0;
}

#endif
