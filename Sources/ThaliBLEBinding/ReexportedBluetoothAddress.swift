// `BluetoothAddress` lives in its own module without C libraries, so that ThaliNodeCore can name a
// Bluetooth peer without linking D-Bus and BlueZ; code that imports ThaliBLEBinding sees it as before.
@_exported import ThaliBluetoothAddress
