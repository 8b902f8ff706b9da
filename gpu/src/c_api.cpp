// C ABI: see cachet/cachet.h (filled in below).
