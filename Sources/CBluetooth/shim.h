#ifndef THALI_CBLUETOOTH_SHIM_H
#define THALI_CBLUETOOTH_SHIM_H
#include <sys/socket.h>
#include <bluetooth/bluetooth.h>
#include <bluetooth/rfcomm.h>
#endif
