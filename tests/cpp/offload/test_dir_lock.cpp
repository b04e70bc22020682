// One job per swap directory (Note [Swap directory ownership]): a second owner is refused
// with the holder named, the lock goes with its owner, and a store's files go with it.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "offload/dir_lock.h"
#include "offload/io_error.h"
#include "offload/swap_store.h"
#include "offload_test_util.h"

namespace zs::offload {
namespace {

using testing::ScratchDir;

TEST(offload_DirLock, ASecondOwnerIsRefusedWithTheHolderNamed) {
  ScratchDir dir;
  DirLock first(dir.path());
  try {
    DirLock second(dir.path());
    FAIL() << "a second lock on a held directory succeeded";
  } catch (const IoError& e) {
    EXPECT_EQ(e.err(), EBUSY);
    const std::string what = e.what();
    EXPECT_NE(what.find(dir.path()), std::string::npos) << what;
    EXPECT_NE(what.find("pid " + std::to_string(::getpid())), std::string::npos) << what;
  }
}

TEST(offload_DirLock, ReleasedLocksCanBeTakenAgainAndLeaveNoFile) {
  ScratchDir dir;
  {
    DirLock lock(dir.path());
    EXPECT_TRUE(lock.held());
  }
  struct stat st {};
  EXPECT_NE(::stat((dir.path() + "/.lock").c_str(), &st), 0);
  DirLock again(dir.path());
  EXPECT_TRUE(again.held());
}

TEST(offload_DirLock, TwoStoresCannotShareADirectoryButTwoNamesCan) {
  ScratchDir dir;
  auto engine = make_io_engine(testing::test_config(IoBackend::kThreads, 64 << 10, 8, 2));
  SwapStoreConfig c;
  c.nvme_path = dir.path();
  c.name = "optimizer";
  c.files = 1;
  SwapStore first(c, *engine);
  EXPECT_THROW(SwapStore(c, *engine), IoError);
  c.name = "params";
  SwapStore other(c, *engine);  // another purpose of the same job: its own directory
  first.close();
  c.name = "optimizer";
  SwapStore after(c, *engine);  // free again once closed
}

}  // namespace
}  // namespace zs::offload
