module github.com/slidinglog/ratelimit/adapters/chi

go 1.26.0

require (
	github.com/go-chi/chi/v5 v5.2.0
	github.com/slidinglog/ratelimit v0.1.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/redis/go-redis/v9 v9.20.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
)

replace github.com/slidinglog/ratelimit => ../..
