package main

import (
	"fmt"
	"os"
)

func main() {
	if err := callgrindRunX(1000, os.Getenv("KEEP")); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
}
