module github.com/parleyhq/parley

go 1.24.0
