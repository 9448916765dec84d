#ifndef THALI_CDBUS_SHIM_H
#define THALI_CDBUS_SHIM_H
#include <dbus/dbus.h>
#endif
