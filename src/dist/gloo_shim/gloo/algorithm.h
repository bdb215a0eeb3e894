// Empty: c10d's ProcessGroupGloo.hpp includes it and uses nothing from it (see rendezvous/store.h).
#pragma once
