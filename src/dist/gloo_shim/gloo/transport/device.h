// Declarations only (see ../rendezvous/store.h): held through shared_ptr by c10d.
#pragma once

namespace gloo::transport {
class Device;
class UnboundBuffer;
}  // namespace gloo::transport
