namespace zs::config {}
