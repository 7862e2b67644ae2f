module github.com/parleyhq/parley

go 1.24.0

require golang.org/x/text v0.34.0
